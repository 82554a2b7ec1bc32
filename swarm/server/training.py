"""The server's training loop: batch selection, drain, GRPO/PPO step, live weight update, checkpoints.

A step reads top to bottom in :meth:`TrainingLoop._step_blocking`: the batch the policy released
(`swarm.server.admission`), its samples and advantages (`swarm.server.step_batch`), the trainer's update,
the new weights served, the episodes consumed, the checkpoint (`swarm.server.checkpoints`) and the
metrics row (`swarm.server.step_history`). Live configuration is `swarm.server.live_config`.

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

Crash safety: an episode is marked consumed (``trained_step``) only after the step's update (a batch
consumed without an update, ``train.skipped``, is marked at the policy version being served). A step
whose later update had a non-finite gradient keeps its earlier, applied updates and is published like
any step (``train.nonfinite``; its journal entry replays only those updates); a batch whose first update
is non-finite changes nothing and is skipped. On restart
the newest checkpoint is loaded and :meth:`Pool.rewind` un-marks episodes consumed by later steps
(their update was lost with the process), so each pooled episode trains exactly once for the persisted
policy line. At ``checkpoint_every=1`` (the default) a step is journaled before it is published and,
unless the previous checkpoint is still being written, snapshotted; its checkpoint is written in the
background and a step never waits for a write (a skipped snapshot is taken by the first step, or the
first idle moment, after the write ends). A restart replays the journaled steps its newest checkpoint
does not cover, so the step counter never goes back (`swarm.server.checkpoints`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from swarm.batch import Batch, ClientVotes
from swarm.config import TrainingConfig
from swarm.engine.base import Engine
from swarm.errors import ConfigError
from swarm.pool import Pool
from swarm.precision import MixedPrecision
from swarm.protocol import ConfigPatch, EngineState, EpisodeKind, SamplingDefaults, ServerStepMetrics
from swarm.server.admission import AdmissionControl
from swarm.server.checkpoints import (
    CheckpointWriter,
    checkpoint_dir,
    checkpoint_due,
    checkpoint_now,
    latest_checkpoint,
    resume,
)
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.episodes import OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.live_config import LiveConfig
from swarm.server.phase import Phase
from swarm.server.step_batch import StepBatch, build_step_batch
from swarm.server.step_history import Drain, StepHistory
from swarm.server.teacher import TeacherClient
from swarm.server.teacher_scoring import TeacherScorer
from swarm.tracking.merge import LossWeighting
from swarm.train import StepInterrupted, TorchTrainer, TrainerBackend, TrainerError

__all__ = ["TrainingLoop", "make_trainer"]

_CATCH_UP_POLL_S = 0.5
"""While a snapshot is owed and no step comes, how often the idle loop looks whether the write ended."""


def make_trainer(
    config: TrainingConfig,
    engine: Engine,
    *,
    run_dir: Path,
    model_dir: Path | None,
    mixed_precision: MixedPrecision,
) -> TrainerBackend:
    """The trainer backend ``config.backend`` names, updating ``engine.trainable_module()``.

    ``verl``: the actor loads the newest full checkpoint of ``run_dir`` when there is one (its weights
    are the run's; the loop restores the step, the server's copy and verl's optimizer state from it as
    for ``torch``), else ``model_dir``; with LoRA always ``model_dir`` (a checkpoint holds the adapters
    only: the loop loads them into the server's copy, which hands them to the actor).

    Raises:
        ConfigError: ``verl`` without verl installed, or without ``model_dir``.
    """
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
    if config.backend == "torch":
        return TorchTrainer(
            engine.trainable_module(), config.trainer, pad_token_id=int(pad), mixed_precision=mixed_precision
        )
    from swarm.train.verl_backend import VerlTrainer

    latest = latest_checkpoint(run_dir) if config.trainer.lora is None else None
    source = latest[1] if latest is not None else model_dir
    if source is None:
        raise ConfigError("--trainer verl needs the model's Hugging Face directory")
    return VerlTrainer(
        engine.trainable_module(),
        source,
        config.trainer,
        int(pad),
        settings=config.verl,
        state_dir=checkpoint_dir(
            run_dir
        ),  # the actor's optimizer shards: moved into a checkpoint by a rename
    )


class TrainingLoop:
    """Drives the steps: waits for a batch, drains, trains, serves the new weights, checkpoints.

    Built from the server's parts, never the server itself: ended episodes reach `admission` (it
    subscribes to ``episodes``' on-end callback), ``phase`` moves through draining and training,
    ``engine``'s weights are updated through the `Engine` protocol, and ``events`` is logged to.

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
        model_dir: the served model's Hugging Face directory (the ``verl`` backend's actor loads it).
        teacher: with ``config.distill``: the teacher's client, its start-up check passed
            (docs/ARCHITECTURE.md §On-policy distillation).
        trainer: a trainer built by the caller (a LoRA tenant's, over its named adapter) instead of
            `make_trainer`'s.
        on_failure: called with the reason when a step fails (an exception) or the trainer rejects a
            batch (e.g. a non-finite gradient); a tenant stops there (`swarm.server.tenants`). ``None``:
            the failure is logged and the loop trains on (the server's one policy).
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
        model_dir: Path | None = None,
        teacher: TeacherClient | None = None,
        trainer: TrainerBackend | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self._on_failure = on_failure
        self.engine = engine
        self._detokenizer = TokenizerDetokenizer(engine.tokenizer)  # text-level merging decodes calls
        self.pool = pool
        self.episodes = episodes
        self.events = events
        self.phase = phase
        self.run_dir = run_dir
        self.trainer = trainer or make_trainer(
            config, engine, run_dir=run_dir, model_dir=model_dir, mixed_precision=mixed_precision
        )
        self._wakeup: asyncio.Event | None = None
        self._writer = CheckpointWriter(run_dir, self.trainer.model, engine.tokenizer, events=events)
        self._stopping = False
        """Set by :meth:`interrupt` (the server is stopping): no step starts."""
        self._trainer_lock = threading.Lock()
        """Held while the trainer steps or is checkpointed (steps run in a worker thread, which a
        cancelled loop does not stop: the stop's `CheckpointWriter.flush` waits for it here)."""
        self.steps = StepHistory(run_dir / "metrics.jsonl")
        keep = config.keep_checkpoints
        self.step = resume(
            run_dir, self.trainer, pool, self.steps, events, tokenizer=engine.tokenizer, keep=keep
        )
        """The last completed step: the policy version being sampled once its update is visible."""
        with engine.pause():  # with LoRA the engine samples the merged copy (or the adapters)
            engine.load_weights(self.trainer.sampling_model, self.step)
        self.admission = AdmissionControl(config, pool, on_change=self.wake)  # from the rewound pool
        self.live = LiveConfig(config, self.trainer, sampling, self.admission)
        episodes.on_end(self.admission.released)
        self.scorer: TeacherScorer | None = None
        """Scores ended episodes with the teacher in the background (distillation only)."""
        if config.distill is not None:
            if teacher is None:
                raise ConfigError("distillation needs the teacher's client (swarm serve --teacher URL)")
            self.scorer = TeacherScorer(teacher, pool, events, config.distill, on_scored=self.wake)
            episodes.on_end(self.scorer.released)

    # -- what the server's routes call ---------------------------------------------------------------------
    @property
    def history(self) -> list[ServerStepMetrics]:
        """The metrics rows, oldest first (``GET /api/v1/metrics``)."""
        return self.steps.rows

    @property
    def votes(self) -> ClientVotes:
        return self.admission.votes

    def admit(self, family: str | None, kind: EpisodeKind, task_id: str) -> None:
        """`AdmissionControl.admit`."""
        self.admission.admit(family, kind, task_id)

    def vote(self, client_id: str, ready: bool) -> None:
        self.admission.vote(client_id, ready)

    def touch(self, client_id: str) -> None:
        self.admission.touch(client_id)

    def leave(self, client_id: str) -> None:
        self.admission.leave(client_id)

    def apply(self, patch: ConfigPatch) -> dict[str, Any]:
        """Validate and stage a live config change (`LiveConfig.apply`); returns the fields changed."""
        changes = self.live.apply(patch)
        self.events.emit("config.changed", f"config changed: {sorted(changes)}", changes=changes)
        self.wake()
        return changes

    def effective_config(self) -> dict[str, Any]:
        """The configuration the next step will use (staged changes included)."""
        return self.live.effective()

    def wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def checkpoint(self) -> int:
        """Save a checkpoint now (blocking; generation pauses meanwhile); returns the step saved.

        A step already checkpointed (the last step of ``max_steps``, or a repeated request) is not
        written or logged again: no update happened since, so the checkpoint on disk is this state."""
        keep = self.config.keep_checkpoints
        with self._trainer_lock, self.engine.pause():
            self._writer.flush(self.trainer, keep=keep)  # the write in flight, then an owed state
            latest = latest_checkpoint(self.run_dir)
            if latest is None or latest[0] != self.trainer.step_count:
                checkpoint_now(
                    self.run_dir, self.trainer, self.engine.tokenizer, keep=keep, events=self.events
                )
            return self.trainer.step_count

    # -- the loop --------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Background task: wait for wake-ups, train whenever the batch policy is satisfied."""
        self._wakeup = asyncio.Event()
        self._wakeup.set()
        if self.scorer is not None:
            self.scorer.start()
        try:
            while True:
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives in the loop
                # iteration the event is set in (a tenant's retire wakes the loop, by aborting its open
                # episodes, then cancels it: the retire hung for good where a recheck timeout was set).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._recheck_s()):
                        await self._wakeup.wait()
                await asyncio.sleep(0.02)  # coalesce a burst of finishes into one batch check
                self._wakeup.clear()
                try:
                    await self._maybe_step()
                    if self._writer.owed and not self._writer.busy:  # a snapshot skipped, the disk free
                        await asyncio.to_thread(self._locked, self._catch_up)
                except Exception as exc:  # a failed step must not kill the server: report it, keep serving
                    self.phase.end_step()
                    self._report_failure(exc)
                    await asyncio.sleep(1.0)
        finally:
            if self.scorer is not None:
                await self.scorer.aclose()
            # a stopping server finishes its checkpoint and writes the newest state if it has none
            await asyncio.to_thread(self._locked, self._flush)

    def _report_failure(self, exc: Exception) -> None:
        reason = f"training step failed: {type(exc).__name__}: {exc}"
        self.events.emit("train.failed", reason, level="error")
        if self._on_failure is not None:
            self._on_failure(reason)

    def _locked(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` holding the trainer lock (in a worker thread)."""
        with self._trainer_lock:
            return work(*args)

    def _catch_up(self) -> None:
        self._writer.catch_up(self.trainer, keep=self.config.keep_checkpoints)

    def _flush(self) -> None:
        self._writer.flush(self.trainer, keep=self.config.keep_checkpoints)

    def _recheck_s(self) -> float | None:
        """Seconds until the batch must be checked with no wake-up (voting liveness, or an unscored
        episode the teacher may score now)."""
        times = [self.admission.recheck_s(), self.scorer.recheck_s() if self.scorer else None]
        times.append(_CATCH_UP_POLL_S if self._writer.owed else None)  # the write may end while idle
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def interrupt(self) -> None:
        """The server is stopping: no step starts from now on, and one under way gives up before its first
        update where the trainer can (`TrainerBackend.interrupt`); its episodes stay pooled."""
        self._stopping = True
        self.trainer.interrupt()

    def _can_train(self) -> bool:
        if not self.config.enabled or self.phase.state is EngineState.PAUSED or self._stopping:
            return False
        return self.config.max_steps is None or self.step < self.config.max_steps

    async def _maybe_step(self) -> None:
        chosen = self.admission.select() if self._can_train() else None
        if chosen is None:
            return
        if self.scorer is not None and self.config.distill is not None:
            # Wait (bounded) for the teacher before draining: rollouts go on meanwhile. With nothing
            # scored there is nothing to train: no drain, no step, the batch stays pooled.
            unscored = await self.scorer.ready(chosen.episode_ids, self.config.distill.wait_s)
            if len(unscored) == len(chosen.episode_ids):
                return
        if self.config.max_staleness is not None:
            await self._step(Drain(stale_aborted=len(self._abort_too_stale())))
            return
        self.phase.drain()
        drain_started = time.monotonic()
        deadline = drain_started + self.config.drain_timeout_s
        while len(self.episodes) and time.monotonic() < deadline and self.phase.state is EngineState.DRAINING:
            await asyncio.sleep(0.05)
        if self.phase.state is not EngineState.DRAINING:  # paused while draining
            return
        aborted = self.episodes.abort_open("aborted at the drain timeout before a training step")
        await self._step(Drain(seconds=time.monotonic() - drain_started, aborted=len(aborted)))

    def _abort_too_stale(self) -> list[str]:
        """Asynchronous mode: abort open episodes that the staleness bound keeps out of every later step."""
        assert self.config.max_staleness is not None
        version = self.step + 1 - self.config.max_staleness
        return self.episodes.abort_older_than(
            version,
            f"too stale: a call was sampled before policy version {version} and max_staleness is "
            f"{self.config.max_staleness} (step {self.step + 1} is starting)",
        )

    async def _step(self, drain: Drain) -> None:
        """Train on the next batch (the phase is ``idle``/``rolling``/``draining``; ``rolling`` after)."""
        batch = self.admission.select()
        if batch is None:
            self.phase.end_step()
            return
        self.phase.train()
        self.events.emit(
            "train.started", f"training step {self.step + 1}: {batch.reason}", episodes=len(batch.episode_ids)
        )
        unscored: set[str] = set()
        if self.scorer is not None and self.config.distill is not None:
            unscored = await self.scorer.ready(batch.episode_ids, self.config.distill.wait_s)
        work = asyncio.ensure_future(
            asyncio.to_thread(self._locked, self._step_blocking, batch, drain, unscored)
        )
        try:
            metrics = await asyncio.shield(work)
        except StepInterrupted as exc:  # the server is stopping (`TrainerBackend.interrupt`)
            self._report_interrupted(exc, len(batch.episode_ids))
            return
        except asyncio.CancelledError:
            # The server stops during the step: its thread cannot be stopped; it gives up before its first
            # update where the trainer can (`TrainerBackend.interrupt`, asked when the stop began), else it
            # publishes the step (served weights, consumed episodes, metrics row); its event is written
            # before the stop goes on, so every finished step leaves both.
            try:
                self._emit_step(await work)
            except StepInterrupted as exc:
                self._report_interrupted(exc, len(batch.episode_ids))
            except Exception as exc:
                self._report_failure(exc)
            raise
        finally:
            self.phase.end_step()
        self._emit_step(metrics)
        self.wake()  # another batch may already be waiting

    def _report_interrupted(self, exc: StepInterrupted, episodes: int) -> None:
        """The ``train.interrupted`` event of a step given up for the server's stop (nothing applied,
        nothing consumed: its episodes train after a restart)."""
        self.events.emit(
            "train.interrupted",
            f"{exc}; its {episodes} episodes stay pooled and train after a restart",
            step=self.step + 1,
            episodes=episodes,
        )

    def _emit_step(self, metrics: ServerStepMetrics | None) -> None:
        """The ``train.step`` event of a finished step (none for a step that trained nothing)."""
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

    def _step_blocking(
        self, chosen: Batch, drain: Drain, unscored: set[str] | None = None
    ) -> ServerStepMetrics | None:
        """One training step: samples and advantages → trainer.step → new weights served → episodes
        marked consumed → checkpoint → metrics logged. Distilling, the episodes of ``unscored`` (and any
        with a trained token the teacher did not score) are left out and stay pooled."""
        batch = build_step_batch(
            chosen,
            self.pool.calls(chosen.episode_ids),
            normalize_std=self.config.normalize_std,
            weighting=LossWeighting(self.config.loss_weighting),
            merge=self.config.merge,
            decode=self._detokenizer.decode,
            staleness=self.admission.staleness(chosen, self.step),
            distill=self.config.distill,
            unscored=unscored or set(),
        )
        if self.scorer is not None:
            batch.distill["teacher_latency_s"] = self.scorer.take_latency()
        if not batch.samples and batch.left_out:
            return None  # nothing scored yet: nothing consumed, the episodes wait for the teacher
        if not batch.samples:
            self._skip(batch, "batch has no trainable tokens; consumed without an update", "warning")
            return None
        with self.engine.pause():  # generation waits; afterwards it samples the new weights
            self.live.take_trainer_changes()
            self.engine.release_memory()
            try:
                base = self.trainer.step(batch.samples, batch.advantages, rewards=batch.rewards)
            except TrainerError as exc:
                self._skip(batch, f"batch rejected by the trainer: {exc}", "error")
                if self._on_failure is not None:
                    self._on_failure(f"batch rejected by the trainer: {exc}")
                return None
            finally:
                self.engine.restore_memory()
            step = self.trainer.step_count
            if base.updates_nonfinite:  # the updates before it were applied: a step like any other
                self.events.emit(
                    "train.nonfinite",
                    f"step {step}: {base.updates_nonfinite} update(s) had a non-finite gradient norm and "
                    f"were not applied; the step keeps its {base.updates} applied update(s) (lower lr, "
                    "check rewards/advantages and logprobs)",
                    level="warning",
                    step=step,
                    updates=base.updates,
                    updates_nonfinite=base.updates_nonfinite,
                )
            # Crash safety (docs/ARCHITECTURE.md): the step's journal entry (and its snapshot, unless a
            # write is in flight) exist before it is published (served, episodes consumed, metrics row,
            # step counter); checkpoints are written in the background, and a restart replays the
            # journaled steps the newest one does not cover. Once a snapshot is owed every step journals.
            checkpoint_s = 0.0
            due = checkpoint_due(step, self.config.checkpoint_every, self.config.max_steps)
            if due or self._writer.owed:
                checkpoint_s = self._writer.checkpoint(
                    self.trainer,
                    batch,
                    policy=self.config.batch.policy.value,
                    keep=self.config.keep_checkpoints,
                    max_updates=base.updates if base.updates_nonfinite else None,
                )
            push = getattr(self.trainer, "push_weights", None)  # verl's direct path sends its own weights
            if push is None or not push(self.engine, step):
                self.engine.load_weights(self.trainer.sampling_model, step)  # waiting calls sample `step`
            self.admission.consumed(batch.consumed, step)
            if self.scorer is not None:
                self.scorer.forget(batch.consumed)
            self.admission.new_window()
        metrics = self.steps.record(
            base, batch, policy=self.config.batch.policy.value, drain=drain, checkpoint_s=checkpoint_s
        )
        self.step = step
        return metrics

    def _skip(self, batch: StepBatch, message: str, level: Literal["warning", "error"]) -> None:
        """Consume a batch without an update (it would fail again) and say why.

        A skip is no step: the step counter stays, no metrics row is written, and the episodes are
        marked consumed at the policy version being served (``trained_step = self.step``), which is
        durable exactly when that step is (docs/ARCHITECTURE.md §Crash safety): a restart neither
        rewinds nor re-consumes them. (Marked ``self.step + 1``, a step that does not exist yet, a
        restart before the next step would count them as consumed by a lost step.)"""
        self.admission.consumed(batch.consumed, self.step)
        self.events.emit("train.skipped", message, level=level)
