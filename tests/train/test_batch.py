"""Batch policies on simulated episode streams, client votes, and family-quota admission."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from swarm.batch import (
    BatchConfig,
    BatchConfigError,
    BatchPolicy,
    ClientVotes,
    EpisodeStatus,
    EpisodeSummary,
    FamilyQuotas,
    UnknownFamilyError,
    admit,
    select_batch,
)
from swarm.errors import ConfigError, RequestError


class Sim:
    """A simulated stream of ended episodes (finish order = append order)."""

    def __init__(self) -> None:
        self.episodes: list[EpisodeSummary] = []
        self.ended = 0

    def end(
        self,
        task: str,
        reward: float | None = 1.0,
        *,
        client: str = "c1",
        status: EpisodeStatus = EpisodeStatus.FINISHED,
        kind: str = "train",
        family: str | None = None,
    ) -> str:
        eid = f"ep{self.ended}"
        self.ended += 1
        self.episodes.append(
            EpisodeSummary(
                episode_id=eid,
                task_id=task,
                client_id=client,
                family=family,
                kind=kind,  # type: ignore[arg-type]
                status=status,
                reward=reward if status is EpisodeStatus.FINISHED else None,
                finished_at=float(self.ended),
            )
        )
        return eid

    def consume(self, ids: list[str]) -> None:
        gone = set(ids)
        self.episodes = [e for e in self.episodes if e.episode_id not in gone]


def test_episodes_policy_waits_for_b_times_g() -> None:
    cfg = BatchConfig(policy=BatchPolicy.EPISODES, batch_size=2, group_size=2)
    sim = Sim()
    ids = [sim.end(f"t{i % 3}", reward=float(i)) for i in range(3)]
    sim.end("t9", status=EpisodeStatus.INFRA_FAILURE)
    assert select_batch(cfg, sim.episodes) is None  # 3 usable + 1 infra failure < 4
    sim.end("t9", status=EpisodeStatus.FINISHED, reward=0.0, kind="eval")
    assert select_batch(cfg, sim.episodes) is None  # eval episodes never count
    ids.append(sim.end("t1", reward=4.0))
    extra = sim.end("t2", reward=5.0)
    batch = select_batch(cfg, sim.episodes)
    assert batch is not None
    assert batch.episode_ids == ids  # the oldest B·G, in finish order
    assert extra not in batch.episode_ids
    assert batch.groups == {"t0": ["ep0"], "t1": ["ep1", "ep5"], "t2": ["ep2"]}
    assert batch.rewards == {"ep0": 0.0, "ep1": 1.0, "ep2": 2.0, "ep5": 4.0}
    assert batch.dropped == ["ep3"]  # the infra failure before the cut is retired


def test_tasks_policy_needs_full_groups_and_ignores_infra_failures() -> None:
    cfg = BatchConfig(policy=BatchPolicy.TASKS, batch_size=2, group_size=3)
    sim = Sim()
    for _ in range(2):
        sim.end("a")
        sim.end("b")
    sim.end("a", status=EpisodeStatus.INFRA_FAILURE)  # does not complete group a
    sim.end("c")
    assert select_batch(cfg, sim.episodes) is None
    sim.end("b")  # b full
    assert select_batch(cfg, sim.episodes) is None
    sim.end("a")  # a full (3 usable)
    sim.end("a")  # a 4th episode of a stays pending
    batch = select_batch(cfg, sim.episodes)
    assert batch is not None
    assert batch.groups == {"a": ["ep0", "ep2", "ep7"], "b": ["ep1", "ep3", "ep6"]}
    assert batch.episode_ids == ["ep0", "ep1", "ep2", "ep3", "ep6", "ep7"]
    assert batch.dropped == ["ep4"]
    assert all(len(g) == 3 for g in batch.groups.values())
    sim.consume(batch.episode_ids + batch.dropped)
    assert [e.episode_id for e in sim.episodes] == ["ep5", "ep8"]


def test_tasks_policy_oldest_completed_groups_win() -> None:
    cfg = BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=2)
    sim = Sim()
    sim.end("slow")
    sim.end("fast")
    sim.end("fast")
    sim.end("slow")
    batch = select_batch(cfg, sim.episodes)
    assert batch is not None and list(batch.groups) == ["fast"]


def test_informative_tasks_drops_zero_signal_groups() -> None:
    cfg = BatchConfig(policy=BatchPolicy.INFORMATIVE_TASKS, batch_size=2, group_size=2)
    sim = Sim()
    sim.end("same", 1.0)
    sim.end("same", 1.0)  # full, all equal → zero signal
    sim.end("x", 1.0)
    sim.end("x", 0.0)  # informative
    assert select_batch(cfg, sim.episodes) is None
    sim.end("y", 0.0)
    sim.end("y", 0.0, status=EpisodeStatus.ABORTED)  # aborted counts with reward 0 → still all equal
    sim.end("z", 0.0, status=EpisodeStatus.ABORTED)
    sim.end("z", 0.5)
    batch = select_batch(cfg, sim.episodes)
    assert batch is not None
    assert batch.groups == {"x": ["ep2", "ep3"], "z": ["ep6", "ep7"]}
    assert batch.rewards["ep6"] == 0.0
    assert batch.dropped == ["ep0", "ep1", "ep4", "ep5"]


def test_aborted_reward_none_excludes_aborts_like_infra_failures() -> None:
    cfg = BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=2, aborted_reward=None)
    sim = Sim()
    sim.end("a", 1.0)
    sim.end("a", status=EpisodeStatus.ABORTED)
    assert select_batch(cfg, sim.episodes) is None
    sim.end("a", 0.0)
    batch = select_batch(cfg, sim.episodes)
    assert batch is not None and batch.groups == {"a": ["ep0", "ep2"]} and batch.dropped == ["ep1"]


def test_all_clients_ready_vote() -> None:
    cfg = BatchConfig(policy=BatchPolicy.ALL_CLIENTS_READY, batch_size=1, group_size=1)
    votes = ClientVotes()
    sim = Sim()
    votes.touch("c1", now=0)
    votes.touch("c2", now=0)
    sim.end("a", client="c1")
    sim.end("b", client="c2")
    sim.end("b", client="c2", status=EpisodeStatus.INFRA_FAILURE)
    assert select_batch(cfg, sim.episodes, votes, now=1) is None
    votes.vote("c1", True, now=1)
    assert select_batch(cfg, sim.episodes, votes, now=1) is None  # c2 has not voted
    votes.vote("c2", True, now=1)
    batch = select_batch(cfg, sim.episodes, votes, now=1)
    assert batch is not None
    assert batch.episode_ids == ["ep0", "ep1"] and batch.dropped == ["ep2"]
    votes.vote("c2", False, now=2)  # withdrawn vote
    assert select_batch(cfg, sim.episodes, votes, now=2) is None
    votes.reset()
    assert votes.ready(now=2) == [] and votes.active(now=2) == ["c1", "c2"]


def test_all_clients_ready_ignores_clients_that_went_silent() -> None:
    cfg = BatchConfig(policy=BatchPolicy.ALL_CLIENTS_READY)
    votes = ClientVotes(active_timeout_s=10)
    sim = Sim()
    votes.touch("dead", now=0)
    sim.end("a", client="alive")
    votes.vote("alive", True, now=5)
    assert select_batch(cfg, sim.episodes, votes, now=5) is None  # "dead" still active
    batch = select_batch(cfg, sim.episodes, votes, now=11)
    assert batch is not None and batch.episode_ids == ["ep0"]
    votes.forget("alive")
    assert votes.active(now=11) == []


def test_any_client_ready_trains_only_the_ready_clients_episodes() -> None:
    cfg = BatchConfig(policy=BatchPolicy.ANY_CLIENT_READY)
    votes = ClientVotes()
    sim = Sim()
    sim.end("a", client="c1")
    sim.end("b", client="c2")
    votes.touch("c1", now=0)
    votes.touch("c2", now=0)
    assert select_batch(cfg, sim.episodes, votes, now=0) is None
    votes.vote("c2", True, now=0)
    batch = select_batch(cfg, sim.episodes, votes, now=0)
    assert batch is not None and batch.episode_ids == ["ep1"] and "c2" in batch.reason


def test_a_dead_clients_episodes_are_not_stranded() -> None:
    """all_clients_ready trains the episodes of clients no longer active with the others'; any_client_ready
    adds them to the next ready client's batch; once every client is gone their episodes are trained."""
    votes = ClientVotes(active_timeout_s=10)
    sim = Sim()
    votes.touch("dead", now=0)
    votes.touch("alive", now=0)
    sim.end("a", client="dead")
    sim.end("b", client="alive")
    sim.end("c", client="alive", status=EpisodeStatus.INFRA_FAILURE)
    votes.vote("alive", True, now=11)
    for policy in (BatchPolicy.ALL_CLIENTS_READY, BatchPolicy.ANY_CLIENT_READY):
        cfg = BatchConfig(policy=policy)
        batch = select_batch(cfg, sim.episodes, votes, now=11)
        assert batch is not None and batch.episode_ids == ["ep0", "ep1"] and batch.dropped == ["ep2"]
    # "dead" still active at t=5: all_clients_ready waits for it, any_client_ready leaves its episode out
    any_batch = select_batch(BatchConfig(policy=BatchPolicy.ANY_CLIENT_READY), sim.episodes, votes, now=5)
    assert any_batch is not None and any_batch.episode_ids == ["ep1"]
    assert select_batch(BatchConfig(policy=BatchPolicy.ALL_CLIENTS_READY), sim.episodes, votes, now=5) is None
    # everyone gone (silent or left): nobody can vote any more, so what they left is trained
    votes.reset()
    votes.forget("alive")
    for policy in (BatchPolicy.ALL_CLIENTS_READY, BatchPolicy.ANY_CLIENT_READY):
        batch = select_batch(BatchConfig(policy=policy), sim.episodes, votes, now=30)
        assert batch is not None and batch.episode_ids == ["ep0", "ep1"]
        assert batch.reason == "every client seen has gone silent or left"


def test_a_fresh_server_waits_for_a_client_before_training_what_was_left() -> None:
    """A restarted server has pending episodes but has seen no client yet: no vacuous batch."""
    sim = Sim()
    sim.end("a", client="gone")
    for policy in (BatchPolicy.ALL_CLIENTS_READY, BatchPolicy.ANY_CLIENT_READY):
        assert select_batch(BatchConfig(policy=policy), sim.episodes, ClientVotes(10), now=0) is None


def test_vote_policy_without_votes_or_episodes() -> None:
    cfg = BatchConfig(policy=BatchPolicy.ANY_CLIENT_READY)
    with pytest.raises(BatchConfigError, match="votes"):
        select_batch(cfg, [])
    votes = ClientVotes()
    votes.vote("c1", True, now=0)
    assert select_batch(cfg, [], votes, now=0) is None  # nothing to train


def test_duplicate_ids_and_bad_summaries_rejected() -> None:
    sim = Sim()
    sim.end("a")
    with pytest.raises(BatchConfigError, match="duplicate"):
        select_batch(BatchConfig(), sim.episodes * 2)
    with pytest.raises(ValidationError, match="finite reward"):
        EpisodeSummary(episode_id="e", task_id="t", client_id="c", reward=None)
    with pytest.raises(ValidationError):
        BatchConfig(batch_size=0)


def test_random_streams_invariants() -> None:
    """Property check over random streams: groups are full, informative, disjoint and infra-free."""
    rng = random.Random(0)
    for policy in (BatchPolicy.TASKS, BatchPolicy.INFORMATIVE_TASKS, BatchPolicy.EPISODES):
        cfg = BatchConfig(policy=policy, batch_size=3, group_size=4)
        sim = Sim()
        trained: list[str] = []
        for _ in range(400):
            status = EpisodeStatus.INFRA_FAILURE if rng.random() < 0.1 else EpisodeStatus.FINISHED
            sim.end(f"t{rng.randrange(6)}", float(rng.random() < 0.5), status=status)
            batch = select_batch(cfg, sim.episodes)
            if batch is None:
                continue
            by_id = {e.episode_id: e for e in sim.episodes}
            assert all(by_id[e].status is EpisodeStatus.FINISHED for e in batch.episode_ids)
            assert not set(batch.episode_ids) & set(trained)
            if policy is BatchPolicy.EPISODES:
                assert len(batch.episode_ids) == 12
            else:
                assert len(batch.groups) == 3 and all(len(g) == 4 for g in batch.groups.values())
            if policy is BatchPolicy.INFORMATIVE_TASKS:
                assert all(len({batch.rewards[e] for e in g}) > 1 for g in batch.groups.values())
            trained += batch.episode_ids
            sim.consume(batch.episode_ids + batch.dropped)
        assert len(trained) >= 24


# ------------------------------------------------------------------------------------------------ quotas

COCKTAIL = {"math": 0.4, "code": 0.3, "terminal": 0.3}


def test_quota_validation() -> None:
    with pytest.raises(ValidationError, match="sum to 1"):
        FamilyQuotas(shares={"math": 0.5, "code": 0.3})
    with pytest.raises(ValidationError, match=r"\(0, 1\]"):
        FamilyQuotas(shares={"math": 1.2, "code": -0.2})
    with pytest.raises(ValidationError, match="at least one"):
        FamilyQuotas(shares={})
    assert issubclass(BatchConfigError, ConfigError) and issubclass(BatchConfigError, ValueError)


def test_unknown_family_is_a_clear_error() -> None:
    quotas = FamilyQuotas(shares=COCKTAIL)
    with pytest.raises(UnknownFamilyError, match=r"'poetry'.*code, math, terminal") as info:
        admit(quotas, {}, "poetry")
    assert isinstance(info.value, RequestError) and info.value.status_code == 422
    with pytest.raises(UnknownFamilyError, match="no task family"):
        admit(quotas, {}, None)
    with pytest.raises(BatchConfigError, match="unknown families"):
        admit(quotas, {"poetry": 3}, "math")


def test_no_quotas_admits_everything() -> None:
    assert admit(None, {}, None).allowed


def test_quota_refuses_a_family_running_ahead() -> None:
    quotas = FamilyQuotas(shares=COCKTAIL, slack=4, retry_after_s=2.5)
    counts: Counter[str] = Counter()
    # A client that only has math tasks: admitted until math exceeds 0.4·N + slack.
    while (a := admit(quotas, dict(counts), "math")).allowed:
        counts["math"] += 1
    assert counts["math"] == 6  # the largest c with c ≤ 0.4·c + 4
    assert not a.allowed and a.retry_after_s == 2.5 and "math" in a.reason
    assert admit(quotas, dict(counts), "code").allowed


@pytest.mark.parametrize("group_size", [1, 4, 8])
def test_admitted_mix_matches_shares_within_one_group(group_size: int) -> None:
    """Two greedy clients (one prefers math, one prefers code) ask for groups; the admitted mix follows the
    quotas within one group at every point."""
    quotas = FamilyQuotas(shares=COCKTAIL, slack=group_size)
    counts: Counter[str] = Counter()
    preferences = [["math", "terminal", "code"], ["code", "math", "terminal"]]
    for turn in range(600):
        for family in preferences[turn % 2]:
            if admit(quotas, dict(counts), family).allowed:
                counts[family] += 1
                break
        n = sum(counts.values())
        for fam, share in COCKTAIL.items():
            assert counts[fam] <= share * n + group_size + 1e-9
    n = sum(counts.values())
    for fam, share in COCKTAIL.items():
        assert abs(counts[fam] - share * n) <= 2 * group_size


def test_one_group_per_task_per_batch() -> None:
    cfg = BatchConfig(policy=BatchPolicy.TASKS, batch_size=2, group_size=2)
    sim = Sim()
    for _ in range(4):
        sim.end("a")  # two full groups of task a
    assert select_batch(cfg, sim.episodes) is None
    sim.end("b")
    sim.end("b")
    batch = select_batch(cfg, sim.episodes)
    assert batch is not None and batch.groups == {"a": ["ep0", "ep1"], "b": ["ep4", "ep5"]}
