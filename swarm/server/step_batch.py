"""What one training step trains on: a policy's `Batch` turned into samples and their advantages.

The rewards travel in the batch (`Batch.rewards`, `Batch.agent_rewards`, from the pending index); the
call records are read from the pool once, merged into samples (`swarm.tracking.merge.build_samples`),
and every sample with trained tokens gets its advantage: its agent's (`agent_advantages`) when the
episode reported per-agent rewards, else its episode's (`episode_advantages`). docs/ARCHITECTURE.md
§The training step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swarm.batch import Batch
from swarm.tracking.merge import Decode, LossWeighting, MergeMode, MergeStats, aggregate_stats, build_samples
from swarm.tracking.records import CallRecord, Sample
from swarm.train.losses import agent_advantages, episode_advantages

__all__ = ["StepBatch", "build_step_batch"]


@dataclass(frozen=True)
class StepBatch:
    """A batch ready for `TrainerBackend.step`."""

    batch: Batch
    """The policy's choice (groups, rewards, dropped episodes)."""
    samples: list[Sample]
    """The samples with at least one trained token, episode by episode in batch order."""
    advantages: list[float]
    """One per sample, aligned with :attr:`samples`."""
    merge: MergeStats
    """Merge statistics over the batch's episodes."""
    staleness: list[int]
    """Per trained episode: policy version being updated − version of its oldest call."""

    @property
    def rewards(self) -> list[float]:
        """One per trained episode (the reward metrics of the step)."""
        return list(self.batch.rewards.values())

    @property
    def consumed(self) -> list[str]:
        """Every episode the step consumes: the trained ones, then the dropped ones."""
        return [*self.batch.episode_ids, *self.batch.dropped]


def build_step_batch(
    batch: Batch,
    calls: Mapping[str, Sequence[CallRecord]],
    *,
    normalize_std: bool,
    weighting: LossWeighting,
    merge: MergeMode,
    decode: Decode,
    staleness: list[int],
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

    Raises:
        MergeError: a recording bug in an episode's calls.
    """
    advantages = episode_advantages(batch.groups, batch.rewards, normalize_std=normalize_std)
    by_agent = agent_advantages(batch.groups, batch.rewards, batch.agent_rewards, normalize_std=normalize_std)
    samples: list[Sample] = []
    advs: list[float] = []
    stats = []
    for eid in batch.episode_ids:
        built, st = build_samples(eid, calls[eid], weighting, merge=merge, decode=decode)
        stats.append(st)
        for s in built:
            if any(s.loss_mask):
                samples.append(s)
                advs.append(by_agent.get((eid, s.agent), advantages.get(eid, 0.0)))
    return StepBatch(batch, samples, advs, aggregate_stats(stats), staleness)
