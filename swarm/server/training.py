"""The server's training loop: batch selection, drain, GRPO/PPO step, live weight update, checkpoints.

State machine (DESIGN.md §2)::

    idle ──begin──► rolling ──batch ready──► draining ──open episodes ended / timeout──► training
                       ▲                                                                    │
                       └──────────────────────── step done (new weights) ◄──────────────────┘
    any state ──pause──► paused ──resume──► rolling

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
failures (excluded from groups, never trained). During ``training`` the engine lock is held, so any
completion request waits and is then sampled by the new weights.

Crash safety: an episode is marked consumed (``trained_step``) only after the step's update. On restart
the newest checkpoint is loaded and :meth:`Pool.rewind` un-marks episodes consumed by later steps
(their update was lost with the process), so each pooled episode trains exactly once for the persisted
policy line, and the step counter continues from the checkpoint (``checkpoint_every=1`` makes that the
last completed step).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

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
from swarm.errors import RequestError, Unavailable
from swarm.pool import StoredEpisode
from swarm.protocol import ConfigPatch, EngineState, EpisodeKind, EpisodeStatus, ServerStepMetrics
from swarm.server.checkpoints import latest_checkpoint, load_trainer_state, load_weights, save_checkpoint
from swarm.tracking.merge import LossWeighting, MergeStats, aggregate_stats, build_samples
from swarm.tracking.records import CallRecord, Sample
from swarm.train import (
    LIVE_FIELDS,
    TorchTrainer,
    TrainerConfig,
    TrainerError,
    episode_advantages,
)

if TYPE_CHECKING:
    from swarm.server.runtime import SwarmRuntime


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


class TrainingLoop:
    """Owns the trainer, votes, quotas window, metrics history and checkpoints of one server."""

    def __init__(self, runtime: SwarmRuntime, config: TrainingConfig) -> None:
        self.runtime = runtime
        self.config = config
        engine = runtime.engine
        pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
        # The engine's compute dtype is the trainer's: its sampler logprobs are the behaviour policy.
        self.trainer = TorchTrainer(
            engine.model, config.trainer, pad_token_id=int(pad), mixed_precision=engine.mixed_precision
        )
        engine.model = self.trainer.sampling_model  # with LoRA: the merged copy (or the adapters)
        self.votes = ClientVotes()
        self.window: Counter[str] = Counter()
        """Train episodes admitted per family since the last step (for quotas)."""
        self.metrics_path = runtime.config.run_dir / "metrics.jsonl"
        self.history: list[ServerStepMetrics] = []
        self._pending_trainer: dict[str, Any] = {}
        self._wakeup: asyncio.Event | None = None
        self._restore()
        # Ended, untrained train episodes in commit order: an in-memory index of the pool so that the
        # batch check after every finish costs O(pending) in memory, not a database scan.
        self._pending_lock = threading.Lock()
        self._pending: dict[str, EpisodeSummary] = {
            e.id: _summary(e) for e in runtime.pool.pending(EpisodeKind.TRAIN)
        }
        # Task → train episodes admitted and not yet consumed or retired (asynchronous admission).
        self._ahead: Counter[str] = Counter(
            p.task_id for p in self._pending.values() if p.status is not EpisodeStatus.INFRA_FAILURE
        )
        # Pending episode → policy version of its oldest call (staleness metrics).
        self._oldest_version: dict[str, int] = {
            eid: min(c.policy_version for c in calls)
            for eid, calls in runtime.pool.calls(list(self._pending)).items()
            if calls
        }

    # -- restore -----------------------------------------------------------------------------------------
    def _restore(self) -> None:
        latest = latest_checkpoint(self.runtime.config.run_dir)
        step = 0
        if latest is not None:
            step, path = latest
            load_weights(path, self.trainer.model)
            self.trainer.sync_sampling_model()
            self.trainer.load_state_dict(load_trainer_state(path))
            self.runtime.events.emit("checkpoint.loaded", f"resumed from checkpoint step {step}", step=step)
        rewound = self.runtime.pool.rewind(step)
        if rewound:
            self.runtime.events.emit(
                "pool.rewound",
                f"{rewound} episodes consumed after step {step} will be trained again (their update was lost)",
                level="warning",
                episodes=rewound,
            )
        self.runtime.step = step
        self.runtime.engine.policy_version = step
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
        if episode.kind is not EpisodeKind.TRAIN:
            return
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
        self.runtime.pool.mark_trained(episode_ids, step)
        with self._pending_lock:
            for eid in episode_ids:
                summary = self._pending.pop(eid, None)
                self._oldest_version.pop(eid, None)
                if summary is not None and summary.status is not EpisodeStatus.INFRA_FAILURE:
                    self._less_ahead(summary.task_id)

    def vote(self, client_id: str, ready: bool) -> None:
        self.votes.vote(client_id, ready)
        self.wake()

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
        sampling = self.runtime.config.sampling
        for name in ("temperature", "top_p", "max_tokens"):
            if name in changes:
                setattr(sampling, name, changes[name])
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
        self.runtime.events.emit("config.changed", f"config changed: {sorted(changes)}", changes=changes)
        self.wake()
        return changes

    def effective_config(self) -> dict[str, Any]:
        """The configuration the next step will use (staged changes included)."""
        trainer = {**self.trainer.config.model_dump(mode="json"), **self._pending_trainer}
        return {
            "training": {**self.config.model_dump(mode="json", exclude={"trainer"}), "trainer": trainer},
            "sampling": self.runtime.config.sampling.model_dump(),
        }

    # -- the loop ----------------------------------------------------------------------------------------
    def _can_train(self) -> bool:
        if not self.config.enabled or self.runtime.state is EngineState.PAUSED:
            return False
        return self.config.max_steps is None or self.runtime.step < self.config.max_steps

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
            await self._wakeup.wait()
            await asyncio.sleep(0.02)  # coalesce a burst of finishes into one batch check
            self._wakeup.clear()
            try:
                await self._maybe_step()
            except Exception as exc:  # a failed step must not kill the server: report it and keep serving
                self.runtime.state = EngineState.ROLLING
                self.runtime.events.emit(
                    "train.failed", f"training step failed: {type(exc).__name__}: {exc}", level="error"
                )
                await asyncio.sleep(1.0)

    async def _maybe_step(self) -> None:
        if not self._can_train() or self._select() is None:
            return
        runtime = self.runtime
        if self.config.max_staleness is not None:
            await self._step(0.0, [], self._abort_too_stale())
            return
        runtime.state = EngineState.DRAINING
        drain_started = time.monotonic()
        deadline = drain_started + self.config.drain_timeout_s
        while runtime.open_count() and time.monotonic() < deadline and runtime.state is EngineState.DRAINING:
            await asyncio.sleep(0.05)
        if runtime.state is not EngineState.DRAINING:  # paused while draining
            return
        aborted = runtime.abort_open("aborted at the drain timeout before a training step")
        await self._step(time.monotonic() - drain_started, aborted, [])

    def _abort_too_stale(self) -> list[str]:
        """Asynchronous mode: abort open episodes that the staleness bound keeps out of every later step."""
        assert self.config.max_staleness is not None
        version = self.runtime.step + 1 - self.config.max_staleness
        return self.runtime.abort_older_than(
            version,
            f"too stale: a call was sampled before policy version {version} and max_staleness is "
            f"{self.config.max_staleness} (step {self.runtime.step + 1} is starting)",
        )

    async def _step(self, drain_s: float, aborted: list[str], stale: list[str]) -> None:
        """Train on the next batch (the state is ``rolling``/``draining``; it is ``rolling`` after)."""
        runtime = self.runtime
        batch = self._select()
        if batch is None:
            runtime.state = EngineState.ROLLING
            return
        runtime.state = EngineState.TRAINING
        runtime.events.emit(
            "train.started",
            f"training step {runtime.step + 1}: {batch.reason}",
            episodes=len(batch.episode_ids),
        )
        try:
            metrics = await asyncio.to_thread(self._step_blocking, batch, drain_s, len(aborted), len(stale))
        finally:
            runtime.state = EngineState.ROLLING
        if metrics is not None:
            runtime.events.emit(
                "train.step",
                f"step {metrics.step}: reward {metrics.reward_mean}, loss {metrics.loss:.4f}, {metrics.tokens} tokens",
                **json.loads(
                    metrics.model_dump_json(
                        include={"step", "reward_mean", "loss", "kl", "tokens", "grad_norm"}
                    )
                ),
            )
        self.wake()  # another batch may already be waiting

    def _samples(self, batch: Batch) -> tuple[list[Sample], list[float], MergeStats]:
        calls = self.runtime.pool.calls(batch.episode_ids)
        stored = self.runtime.pool.episodes(batch.episode_ids)
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

    def _step_blocking(
        self, batch: Batch, drain_s: float, drain_aborted: int, stale_aborted: int
    ) -> ServerStepMetrics | None:
        runtime = self.runtime
        samples, advs, merge = self._samples(batch)
        with self._pending_lock:
            staleness = [
                runtime.step - self._oldest_version.get(eid, runtime.step) for eid in batch.episode_ids
            ]
        consumed = list(batch.episode_ids) + list(batch.dropped)
        if not samples:
            self._consumed(consumed, runtime.step + 1)
            runtime.events.emit(
                "train.skipped", "batch has no trainable tokens; consumed without an update", level="warning"
            )
            return None
        with runtime.engine.lock:  # generation pauses; afterwards it samples the new weights
            if self._pending_trainer:
                self.trainer.update_config(**self._pending_trainer)
                self._pending_trainer.clear()
            try:
                base = self.trainer.step(samples, advs, rewards=list(batch.rewards.values()))
            except TrainerError as exc:
                self._consumed(consumed, runtime.step + 1)
                runtime.events.emit("train.skipped", f"batch rejected by the trainer: {exc}", level="error")
                return None
            step = self.trainer.step_count
            runtime.engine.policy_version = step  # calls waiting on the lock are sampled by step's weights
            # Order matters for crash safety: consumed before the checkpoint (a crash in between rewinds
            # them at restart), and the new step made visible last.
            self._consumed(consumed, step)
            self.window.clear()
            self.votes.reset()
            checkpoint_s = 0.0
            if step % self.config.checkpoint_every == 0 or (
                self.config.max_steps is not None and step >= self.config.max_steps
            ):
                checkpoint_s = self._checkpoint_locked()
        metrics = ServerStepMetrics(
            **base.model_dump(),
            batch_policy=self.config.batch.policy.value,
            groups=len(batch.groups),
            episodes_dropped=len(batch.dropped),
            calls=merge.calls,
            merge_ratio=merge.merge_ratio,
            prefix_breaks=dict(merge.prefix_breaks),
            splices=merge.splices,
            tokens_saved=merge.tokens_saved,
            drain_s=drain_s,
            drain_aborted=drain_aborted,
            stale_aborted=stale_aborted,
            staleness_mean=sum(staleness) / len(staleness) if staleness else 0.0,
            staleness_max=max(staleness, default=0),
            checkpoint_s=checkpoint_s,
        )
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(metrics.model_dump_json() + "\n")
        self.history.append(metrics)
        runtime.step = step
        return metrics

    def _checkpoint_locked(self) -> float:
        started = time.perf_counter()
        save_checkpoint(
            self.runtime.config.run_dir,
            self.trainer.step_count,
            self.trainer.model,
            self.runtime.tokenizer,
            self.trainer.state_dict(),
            keep=self.config.keep_checkpoints,
        )
        elapsed = time.perf_counter() - started
        self.runtime.events.emit(
            "checkpoint.saved",
            f"checkpoint step {self.trainer.step_count} ({elapsed:.1f} s)",
            step=self.trainer.step_count,
        )
        return elapsed

    def checkpoint(self) -> int:
        """Save a checkpoint now (blocking; generation pauses meanwhile); returns the step saved."""
        with self.runtime.engine.lock:
            self._checkpoint_locked()
            return self.trainer.step_count


__all__ = ["TrainingLoop", "agent_advantages"]
