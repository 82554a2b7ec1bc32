"""A step's batch: the rewards travel with the policy's `Batch` (no pool re-read), every sample with
trained tokens gets its agent's advantage or its episode's, and the metrics row nests the batch's merge
statistics while serving the same keys."""

from __future__ import annotations

from swarm.batch import BatchConfig, BatchPolicy, EpisodeSummary, select_batch
from swarm.protocol import ServerStepMetrics
from swarm.server.step_batch import build_step_batch
from swarm.tracking.merge import LossWeighting, MergeMode, MergeStats
from swarm.tracking.records import CallRecord, FinishReason


def _call(index: int, agent: str, prompt: list[int]) -> CallRecord:
    return CallRecord(
        index=index,
        agent=agent,
        trainable=True,
        prompt_ids=prompt,
        completion_ids=[7, 8],
        logprobs=[-1.0, -1.0],
        finish_reason=FinishReason.STOP,
    )


def _summary(eid: str, reward: float, agents: dict[str, float]) -> EpisodeSummary:
    return EpisodeSummary(episode_id=eid, task_id="game", client_id="c", reward=reward, agent_rewards=agents)


def test_agent_rewards_travel_with_the_batch_to_the_samples_advantages() -> None:
    pending = [_summary("e1", 0.5, {"spy": 1.0}), _summary("e2", 0.5, {"spy": 0.0})]
    batch = select_batch(BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=2), pending)
    assert batch is not None and batch.agent_rewards == {"e1": {"spy": 1.0}, "e2": {"spy": 0.0}}
    # each episode: one call of the spy and one of a civilian (separate chains: another prompt)
    calls = {eid: [_call(0, "spy", [1, 2]), _call(1, "civilian", [3, 4])] for eid in ("e1", "e2")}
    step = build_step_batch(
        batch,
        calls,
        normalize_std=False,
        weighting=LossWeighting.EPISODE,
        merge=MergeMode.TOKEN,
        decode=lambda ids: "",
        staleness=[0, 0],
    )
    by_sample = {(s.episode_id, s.agent): a for s, a in zip(step.samples, step.advantages, strict=True)}
    # the spy's own rewards differ; the civilian falls back to the episode's (equal) reward: 0
    assert by_sample == {
        ("e1", "spy"): 0.5,
        ("e1", "civilian"): 0.0,
        ("e2", "spy"): -0.5,
        ("e2", "civilian"): 0.0,
    }
    assert step.rewards == [0.5, 0.5] and step.consumed == ["e1", "e2"]
    assert step.merge.calls == 4 and step.merge.samples == 4


def test_a_metrics_row_serves_the_merge_fields_at_its_top_level() -> None:
    stats = MergeStats(episodes=2, calls=5, samples=2, merge_ratio=2.5, prefix_breaks={"resampled": 1})
    stats.token_breaks, stats.splices, stats.tokens_saved = 1, 3, 40
    row = ServerStepMetrics(
        step=1, samples=2, episodes=2, tokens=10, adv_mean=0.0, adv_std=1.0, adv_min=-1.0, adv_max=1.0,
        loss=0.1, policy_loss=0.1, clip_frac=0.0, entropy=1.0, grad_norm=1.0, grad_norm_max=1.0,
        ratio_mean=1.0, logprob_drift_mean=0.0, logprob_drift_max=0.0, lr=1e-5, updates=1,
        micro_batches=1, merge=stats,
    )  # fmt: skip
    wire = row.model_dump()
    assert "merge" not in wire
    assert {k: wire[k] for k in ("calls", "merge_ratio", "prefix_breaks", "token_breaks", "splices")} == {
        "calls": 5,
        "merge_ratio": 2.5,
        "prefix_breaks": {"resampled": 1},
        "token_breaks": 1,
        "splices": 3,
    }
    back = ServerStepMetrics.model_validate_json(row.model_dump_json())
    assert back.model_dump() == wire and back.merge.tokens_saved == 40
