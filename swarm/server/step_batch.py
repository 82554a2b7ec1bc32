"""What one training step trains on: a policy's `Batch` turned into samples and their advantages.

The rewards travel in the batch (`Batch.rewards`, `Batch.agent_rewards`, from the pending index); the
call records are read from the pool once, merged into samples (`swarm.tracking.merge.build_samples`),
and every sample with trained tokens gets its advantage: its agent's (`agent_advantages`) when the
episode reported per-agent rewards, else its episode's (`episode_advantages`). docs/ARCHITECTURE.md
§The training step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from swarm.batch import Batch
from swarm.config import DistillConfig
from swarm.tracking.merge import Decode, LossWeighting, MergeMode, MergeStats, aggregate_stats, build_samples
from swarm.tracking.records import CallRecord, Sample
from swarm.train.backend import Advantage
from swarm.train.distill import distill_statistics, token_advantages
from swarm.train.losses import agent_advantages, episode_advantages

__all__ = ["StepBatch", "build_step_batch"]


@dataclass(frozen=True)
class StepBatch:
    """A batch ready for `TrainerBackend.step`."""

    batch: Batch
    """The policy's choice (groups, rewards, dropped episodes)."""
    samples: list[Sample]
    """The samples with at least one trained token, episode by episode in batch order."""
    advantages: list[Advantage]
    """One per sample, aligned with :attr:`samples`: a float, or per token when distilling."""
    merge: MergeStats
    """Merge statistics over the batch's episodes."""
    staleness: list[int]
    """Per trained episode: policy version being updated − version of its oldest call."""
    left_out: list[str] = field(default_factory=list)
    """Distillation: episodes of the batch the teacher has not scored; not trained, not consumed (they
    stay in the pool and train with a later step once scored)."""
    distill: dict[str, float] = field(default_factory=dict)
    """Distillation metrics of the batch, ``ServerStepMetrics.distill`` (``teacher_kl``,
    ``teacher_kl/<agent>``, ``scored_frac``, ``unscored_episodes``); empty without a teacher."""

    @property
    def rewards(self) -> list[float]:
        """One per trained episode (the reward metrics of the step)."""
        return [r for eid, r in self.batch.rewards.items() if eid not in self.left_out]

    @property
    def consumed(self) -> list[str]:
        """Every episode the step consumes: the trained ones, then the dropped ones (not those left out)."""
        left = set(self.left_out)
        return [*(e for e in self.batch.episode_ids if e not in left), *self.batch.dropped]


def build_step_batch(
    batch: Batch,
    calls: Mapping[str, Sequence[CallRecord]],
    *,
    normalize_std: bool,
    weighting: LossWeighting,
    merge: MergeMode,
    decode: Decode,
    staleness: list[int],
    distill: DistillConfig | None = None,
    unscored: Collection[str] = (),
) -> StepBatch:
    """Samples and advantages of ``batch``.

    Args:
        batch: the episodes to train (`swarm.batch.select_batch`).
        calls: episode id → its call records, for every episode of ``batch.episode_ids``.
        normalize_std: divide advantages by the group std (GRPO) or not (Dr. GRPO).
        weighting: sample weights (`LossWeighting`).
        merge: how calls join chains (`MergeMode`).
        decode: ids → text, for text-level merging.
        staleness: per trained episode, carried into the step's metrics.
        distill: with a teacher: per-token advantages (`swarm.train.distill.token_advantages`, ``pure`` or
            ``mixed`` with ``coef``) from the calls' teacher logprobs; GRPO advantages are still computed
            over the whole groups (mixed mode adds them).
        unscored: distillation: episodes the teacher has not scored (left out, as is any episode with a
            trained token that lacks a teacher logprob).

    Raises:
        MergeError: a recording bug in an episode's calls.
    """
    advantages = episode_advantages(batch.groups, batch.rewards, normalize_std=normalize_std)
    by_agent = agent_advantages(batch.groups, batch.rewards, batch.agent_rewards, normalize_std=normalize_std)
    samples: list[Sample] = []
    advs: list[Advantage] = []
    stats = []
    left_out: list[str] = []
    tokens = {"all": 0, "scored": 0}
    for eid in batch.episode_ids:
        built, st = build_samples(eid, calls[eid], weighting, merge=merge, decode=decode)
        trained = [s for s in built if any(s.loss_mask)]
        task = [by_agent.get((eid, s.agent), advantages.get(eid, 0.0)) for s in trained]
        episode_tokens = sum(sum(s.loss_mask) for s in trained)
        tokens["all"] += episode_tokens
        per_sample: list[Advantage] = list(task)
        if distill is not None:
            try:
                if eid in unscored:
                    raise ValueError("not scored")
                per_sample = [
                    token_advantages(s, a, distill.mode, distill.coef)
                    for s, a in zip(trained, task, strict=True)
                ]
            except ValueError:
                left_out.append(eid)
                continue
        tokens["scored"] += episode_tokens
        stats.append(st)
        samples.extend(trained)
        advs.extend(per_sample)
    metrics: dict[str, float] = {}
    if distill is not None:
        metrics = {k: v for k, v in distill_statistics(samples).items() if k != "tokens"}
        metrics["scored_frac"] = tokens["scored"] / tokens["all"] if tokens["all"] else 1.0
        metrics["unscored_episodes"] = float(len(left_out))
    return StepBatch(batch, samples, advs, aggregate_stats(stats), staleness, left_out, metrics)
