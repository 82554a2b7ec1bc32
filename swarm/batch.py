"""Batch policies and task-family quotas: when to train, on which episodes, in what mix.

See docs/ARCHITECTURE.md §Batch policies and quotas.

Everything here is pure and server side: no model, no database, no clock unless passed in. The server keeps
the pool of finished-but-untrained episodes (in finish order) and asks :func:`select_batch` after every
``finish``/``abort``/vote; a non-``None`` answer starts a training step on ``Batch.episode_ids``.

Policies (``B`` = ``batch_size``, ``G`` = ``group_size``; a *group* is the episodes of one task):

=====================  ==================================================================================
``episodes``           ≥ ``B·G`` eligible episodes: the oldest ``B·G`` are trained (groups may be partial).
``tasks``              ≥ ``B`` tasks with a full group of ``G``: the ``B`` groups completed first are trained
                       (one group per task per batch; a task's extra episodes wait for the next batch).
``informative_tasks``  ≥ ``B`` full groups whose rewards are not all equal; full groups with equal rewards
                       (zero GRPO signal) met on the way are consumed untrained and listed in ``dropped``.
``all_clients_ready``  every active client voted ready: all eligible episodes of all clients are trained
                       (those of clients no longer active included). Once every client seen has gone
                       silent or left, the rule holds vacuously and their episodes are trained.
``any_client_ready``   at least one active client voted ready: the eligible episodes of the clients that
                       voted ready, and of clients no longer active, are trained (others keep rolling).
                       Once every client seen has gone silent or left, their episodes are trained.
=====================  ==================================================================================

Liveness: a client is *active* while it was seen (episode begun or ended, heartbeat, vote) within
``ClientVotes.active_timeout_s``; a dead client therefore stops blocking ``all_clients_ready`` after that
timeout, and its finished episodes are not stranded.

Eligibility: only ``kind == "train"`` episodes count. ``INFRA_FAILURE`` episodes (the server or the client's
infrastructure failed, not the policy) never enter a group and never count towards ``G``; they are listed in
``dropped`` of the next batch so the pool can retire them (a client that wants its group complete re-runs
the failed episode). ``ABORTED`` episodes (the workflow gave up, e.g. the
agent broke its tool protocol) are policy failures: by default they count with reward
``BatchConfig.aborted_reward`` (0.0); set it to ``None`` to treat them like infrastructure failures.

Quotas (cocktail mix): :class:`FamilyQuotas` + :func:`admit` decide at episode admission whether a family
may start another episode (else the server answers ``429`` with ``Retry-After``). Admission guarantees, in
any window of admitted train episodes, ``count_f ≤ share_f · N + G`` for every family ``f`` (``N`` episodes in
the window), so a batch of ``B`` groups drawn from the window matches the ratio within one group.

Errors (part of the tree in :mod:`swarm.errors`)::

    SwarmError
    ├── ConfigError (ValueError)
    │   └── BatchConfigError      invalid policy or quota configuration, bad policy input
    └── RequestError (ValueError)
        └── UnknownFamilyError    an episode names a family the quotas do not list (HTTP 422)
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from swarm.errors import ConfigError, RequestError
from swarm.protocol import TENANT_BATCH_POLICIES, BatchPolicy, EpisodeStatus

__all__ = [
    "Admission",
    "Batch",
    "BatchConfig",
    "BatchConfigError",
    "BatchPolicy",
    "ClientVotes",
    "EpisodeStatus",
    "EpisodeSummary",
    "FamilyQuotas",
    "UnknownFamilyError",
    "admit",
    "select_batch",
    "tenant_policy_refusal",
]


class BatchConfigError(ConfigError):
    """A batch policy or quota configuration is invalid."""


class UnknownFamilyError(RequestError):
    """An episode names a task family that the configured quotas do not list.

    Attributes:
        family: The family the episode asked for (``None`` when the episode named none).
        known: The families the quotas list.
    """

    def __init__(self, family: str | None, known: Iterable[str]) -> None:
        self.family = family
        self.known = sorted(known)
        what = "no task family" if family is None else f"task family {family!r}"
        super().__init__(
            f"episode has {what}, but family quotas are configured for {', '.join(self.known)}; "
            "pass one of them as the episode's family",
            status_code=422,
            param="family",
        )


class EpisodeSummary(BaseModel):
    """What a batch policy needs to know about one ended episode (no tokens)."""

    episode_id: str
    task_id: str
    """Task the episode solved; episodes of one task form a GRPO group."""
    client_id: str
    """Client (runner) that opened the episode; used by the voting policies."""
    family: str | None = None
    """Task family for quotas (``"math"``, ``"code"``…), ``None`` when the run uses no quotas."""
    kind: Literal["train", "eval"] = "train"
    status: EpisodeStatus = EpisodeStatus.FINISHED
    reward: float | None = None
    """Scalar reward reported at ``finish`` (``None`` for aborted episodes)."""
    agent_rewards: dict[str, float] = Field(default_factory=dict)
    """Per-agent rewards reported at ``finish`` (multi-agent episodes; empty otherwise): a step's
    per-agent advantages (`swarm.train.losses.agent_advantages`) read them from the batch."""
    finished_at: float = 0.0
    """Unix time (s) when the episode ended."""

    @model_validator(mode="after")
    def _finished_has_reward(self) -> EpisodeSummary:
        if self.status is EpisodeStatus.OPEN:
            raise ValueError(f"episode {self.episode_id!r} is still open: only ended episodes enter batches")
        if self.status is EpisodeStatus.FINISHED and (self.reward is None or not math.isfinite(self.reward)):
            raise ValueError(
                f"finished episode {self.episode_id!r} needs a finite reward, got {self.reward!r}"
            )
        return self


class BatchConfig(BaseModel):
    """Typed configuration of the batch policy (live-editable through ``PATCH /api/v1/config``)."""

    policy: BatchPolicy = BatchPolicy.TASKS
    batch_size: int = Field(default=8, ge=1)
    """B: number of groups (tasks) per training batch; ``episodes`` trains B·G episodes."""
    group_size: int = Field(default=8, ge=1)
    """G: episodes per task (GRPO group size)."""
    aborted_reward: float | None = 0.0
    """Reward given to ``ABORTED`` episodes in group statistics; ``None`` excludes them like infra failures."""

    @model_validator(mode="after")
    def _groups_carry_signal(self) -> BatchConfig:
        if self.group_size < 2 and self.policy in (BatchPolicy.TASKS, BatchPolicy.INFORMATIVE_TASKS):
            raise ValueError(
                f"group_size 1 with the {self.policy.value!r} policy: every GRPO group is one episode, "
                "whose advantage is 0, so nothing would be learned; use group_size >= 2"
            )
        return self


class Batch(BaseModel):
    """Episodes to train now, as chosen by :func:`select_batch`.

    The pool marks ``episode_ids`` trained after the step and ``dropped`` consumed-untrained.
    """

    episode_ids: list[str]
    """Episodes to train, in finish order."""
    groups: dict[str, list[str]]
    """task_id → episode ids of that task in this batch (the GRPO groups), tasks in order of first episode."""
    rewards: dict[str, float]
    """episode_id → reward used for the group statistics (``aborted_reward`` for aborted episodes)."""
    agent_rewards: dict[str, dict[str, float]] = Field(default_factory=dict)
    """episode_id → per-agent rewards, for the trained episodes that reported them."""
    dropped: list[str] = Field(default_factory=list)
    """Episodes consumed but not trained: infra failures (and aborts when ``aborted_reward`` is None) seen up
    to the batch's last episode, and, for ``informative_tasks``, full groups whose rewards are all equal."""
    reason: str
    """Human-readable reason the policy fired (for logs and ``/api/v1/events``)."""


class ClientVotes:
    """Readiness votes of the clients, for the ``*_client_ready`` policies.

    A client is *active* once it was seen (an episode opened, a heartbeat, a vote) and, when
    ``active_timeout_s`` is set, seen within that many seconds. Votes persist until :meth:`reset`, which the
    server calls after it trains the batch the votes produced.

    Args:
        active_timeout_s: Seconds after the last sighting at which a client stops counting as active (so a
            dead runner cannot block ``all_clients_ready``); ``None`` keeps clients active until
            :meth:`forget`.
    """

    def __init__(self, active_timeout_s: float | None = None) -> None:
        if active_timeout_s is not None and active_timeout_s <= 0:
            raise BatchConfigError(f"active_timeout_s must be positive, got {active_timeout_s}")
        self.active_timeout_s = active_timeout_s
        self._last_seen: dict[str, float] = {}
        self._ready: dict[str, bool] = {}
        self.seen_any = False
        """Whether any client was seen since this object was made (the vacuous ``all_clients_ready``
        needs one: a restarted server waits for its clients before it trains what they left)."""

    def touch(self, client_id: str, now: float | None = None) -> None:
        """Record that ``client_id`` is alive (episode opened, heartbeat)."""
        self._last_seen[client_id] = time.time() if now is None else now
        self.seen_any = True

    def vote(self, client_id: str, ready: bool, now: float | None = None) -> None:
        """Record ``client_id``'s vote (``ready=False`` withdraws an earlier vote); voting also touches."""
        self.touch(client_id, now)
        self._ready[client_id] = ready

    def forget(self, client_id: str) -> None:
        """Remove a client (it said goodbye); it no longer counts as active."""
        self._last_seen.pop(client_id, None)
        self._ready.pop(client_id, None)

    def reset(self) -> None:
        """Clear all votes (clients stay active); call after training the batch the votes produced."""
        self._ready.clear()

    def active(self, now: float | None = None) -> list[str]:
        """Active client ids, sorted."""
        if self.active_timeout_s is None:
            return sorted(self._last_seen)
        t = time.time() if now is None else now
        return sorted(c for c, seen in self._last_seen.items() if t - seen <= self.active_timeout_s)

    def ready(self, now: float | None = None) -> list[str]:
        """Active clients whose current vote is ready, sorted."""
        return [c for c in self.active(now) if self._ready.get(c, False)]


def _effective_reward(ep: EpisodeSummary, config: BatchConfig) -> float | None:
    """Reward used for group statistics, or ``None`` when the episode never enters a group."""
    if ep.status is EpisodeStatus.FINISHED:
        return ep.reward
    if ep.status is EpisodeStatus.ABORTED:
        return config.aborted_reward
    return None


def _make_batch(
    chosen: Sequence[EpisodeSummary],
    rewards: dict[str, float],
    dropped: Sequence[str],
    reason: str,
) -> Batch:
    groups: dict[str, list[str]] = {}
    for ep in chosen:
        groups.setdefault(ep.task_id, []).append(ep.episode_id)
    return Batch(
        episode_ids=[ep.episode_id for ep in chosen],
        groups=groups,
        rewards={ep.episode_id: rewards[ep.episode_id] for ep in chosen},
        agent_rewards={ep.episode_id: ep.agent_rewards for ep in chosen if ep.agent_rewards},
        dropped=list(dropped),
        reason=reason,
    )


def select_batch(
    config: BatchConfig,
    pending: Sequence[EpisodeSummary],
    votes: ClientVotes | None = None,
    now: float | None = None,
) -> Batch | None:
    """Choose the episodes to train now, or ``None`` when the policy is not satisfied yet.

    Deterministic: episodes are considered in the order given (finish order, oldest first) and the oldest
    complete units win. ``eval`` episodes are ignored. Does not mutate ``votes``.

    Args:
        config: Policy, B and G.
        pending: Ended, untrained episodes in finish order.
        votes: Client readiness; required by the ``*_client_ready`` policies.
        now: Unix time for the vote activity window (default: the current time).

    Returns:
        The batch, or ``None``.

    Raises:
        BatchConfigError: A voting policy without ``votes``, or duplicate episode ids in ``pending``.
    """
    ids = [ep.episode_id for ep in pending]
    if len(set(ids)) != len(ids):
        raise BatchConfigError("pending episodes contain duplicate episode ids")
    eligible = _Eligible(config, pending)
    policy = config.policy
    if policy is BatchPolicy.EPISODES:
        return _episodes_batch(config, eligible)
    if policy in (BatchPolicy.TASKS, BatchPolicy.INFORMATIVE_TASKS):
        return _tasks_batch(config, eligible)
    if votes is None:
        raise BatchConfigError(f"batch policy {policy.value!r} needs client votes")
    return _voted_batch(config, eligible, votes, now)


class _Eligible:
    """The train episodes of ``pending`` split into usable ones (with their group reward) and unusable
    ones (infra failures; aborts when ``aborted_reward`` is ``None``), with finish-order positions."""

    def __init__(self, config: BatchConfig, pending: Sequence[EpisodeSummary]) -> None:
        self.position = {ep.episode_id: i for i, ep in enumerate(pending)}
        self.rewards: dict[str, float] = {}
        self.usable: list[EpisodeSummary] = []
        self.unusable: list[EpisodeSummary] = []
        for ep in pending:
            if ep.kind != "train":
                continue
            r = _effective_reward(ep, config)
            if r is None:
                self.unusable.append(ep)
            else:
                self.rewards[ep.episode_id] = r
                self.usable.append(ep)

    def dropped_before(self, last_id: str, extra: Sequence[str] = ()) -> list[str]:
        """Unusable episodes are retired with the batch that covers their place in the finish order."""
        cut = self.position[last_id]
        return [ep.episode_id for ep in self.unusable if self.position[ep.episode_id] < cut] + list(extra)

    def batch(self, chosen: Sequence[EpisodeSummary], dropped: Sequence[str], reason: str) -> Batch:
        return _make_batch(chosen, self.rewards, dropped, reason)


def _episodes_batch(config: BatchConfig, eligible: _Eligible) -> Batch | None:
    """``episodes``: the oldest B·G usable episodes."""
    n = config.batch_size * config.group_size
    if len(eligible.usable) < n:
        return None
    chosen = eligible.usable[:n]
    return eligible.batch(
        chosen, eligible.dropped_before(chosen[-1].episode_id), f"{n} episodes finished (B·G)"
    )


def _tasks_batch(config: BatchConfig, eligible: _Eligible) -> Batch | None:
    """``tasks`` / ``informative_tasks``: the first B groups to complete (informative ones only)."""
    B, G = config.batch_size, config.group_size
    informative_only = config.policy is BatchPolicy.INFORMATIVE_TASKS
    by_task: dict[str, list[EpisodeSummary]] = {}
    chosen_groups: list[list[EpisodeSummary]] = []
    zero_signal: list[str] = []
    chosen_tasks: set[str] = set()
    # Walk in finish order; a group is complete when its G-th usable episode arrives. A batch holds at most
    # one group per task (groups are keyed by task): a task's next group waits for the next batch.
    for ep in eligible.usable:
        if ep.task_id in chosen_tasks:
            continue
        members = by_task.setdefault(ep.task_id, [])
        members.append(ep)
        if len(members) < G:
            continue
        group = by_task.pop(ep.task_id)
        if informative_only and len({eligible.rewards[m.episode_id] for m in group}) == 1:
            zero_signal.extend(m.episode_id for m in group)
            continue
        chosen_groups.append(group)
        chosen_tasks.add(ep.task_id)
        if len(chosen_groups) == B:
            chosen = sorted(
                (m for g in chosen_groups for m in g), key=lambda m: eligible.position[m.episode_id]
            )
            what = "informative full groups" if informative_only else "full groups"
            return eligible.batch(
                chosen, eligible.dropped_before(ep.episode_id, zero_signal), f"{B} {what} of {G} episodes"
            )
    return None


def _voted_batch(
    config: BatchConfig, eligible: _Eligible, votes: ClientVotes, now: float | None
) -> Batch | None:
    """``all_clients_ready`` / ``any_client_ready``: the episodes the votes release."""
    policy = config.policy
    active = set(votes.active(now))
    ready = votes.ready(now)
    all_gone = not active and votes.seen_any  # nobody is left to vote: train what they left
    if policy is BatchPolicy.ALL_CLIENTS_READY:
        if len(ready) != len(active) or not (active or all_gone):
            return None
        reason = f"all {len(active)} active clients voted ready"
    else:
        if not (ready or all_gone):
            return None
        reason = f"clients {', '.join(ready)} voted ready"
    if all_gone:
        reason = "every client seen has gone silent or left"

    def takes(client_id: str) -> bool:
        # all_clients_ready: everyone's episodes; any_client_ready: the ready clients' episodes and
        # those of clients no longer active (nobody will vote for them).
        if policy is BatchPolicy.ALL_CLIENTS_READY:
            return True
        return client_id in ready or client_id not in active

    chosen = [ep for ep in eligible.usable if takes(ep.client_id)]
    if not chosen:
        return None
    return eligible.batch(chosen, [ep.episode_id for ep in eligible.unusable if takes(ep.client_id)], reason)


class FamilyQuotas(BaseModel):
    """Target mix of task families in training (e.g. ``{"math": 0.4, "code": 0.3, "terminal": 0.3}``)."""

    shares: dict[str, float]
    """family → share of train episodes; each share in (0, 1], summing to 1 (±1e-6)."""
    slack: int = Field(default=8, ge=1)
    """Episodes a family may run ahead of its share; set it to the group size G so a group is never split."""
    retry_after_s: float = Field(default=5.0, gt=0)
    """Seconds the server tells a refused client to wait (``Retry-After``)."""

    @field_validator("shares")
    @classmethod
    def _valid_shares(cls, shares: dict[str, float]) -> dict[str, float]:
        if not shares:
            raise BatchConfigError("family quotas need at least one family")
        bad = {f: s for f, s in shares.items() if not (0.0 < s <= 1.0)}
        if bad:
            raise BatchConfigError(f"family shares must be in (0, 1], got {bad}")
        total = sum(shares.values())
        if abs(total - 1.0) > 1e-6:
            raise BatchConfigError(f"family shares must sum to 1, got {total:.6g} for {shares}")
        return shares


class Admission(BaseModel):
    """Answer of :func:`admit`: whether a new episode may start now."""

    allowed: bool
    retry_after_s: float = 0.0
    """When refused: seconds to wait before retrying (the server's ``Retry-After``)."""
    reason: str = ""


def admit(quotas: FamilyQuotas | None, counts: dict[str, int], family: str | None) -> Admission:
    """Decide whether a new train episode of ``family`` may be admitted under the quotas.

    Rule: with ``N = Σ counts`` episodes already admitted in the current window, admit iff
    ``counts[family] + 1 ≤ share · (N + 1) + slack``. By induction every family then satisfies
    ``count_f ≤ share_f · N + slack`` at all times, so with ``slack = G`` a batch built from the window's
    groups matches the configured ratio within one group. The window is the server's choice: typically the
    train episodes admitted since the last training step, counting in-flight ones and excluding infra
    failures. Eval episodes should not be passed here.

    Args:
        quotas: The configured quotas, or ``None`` (then everything is admitted).
        counts: family → train episodes admitted in the window (missing families count 0).
        family: Family of the episode asking to start.

    Returns:
        The admission decision.

    Raises:
        UnknownFamilyError: Quotas are set and ``family`` is ``None`` or not listed.
        BatchConfigError: ``counts`` names an unknown family or holds a negative count.
    """
    if quotas is None:
        return Admission(allowed=True, reason="no family quotas")
    if family is None or family not in quotas.shares:
        raise UnknownFamilyError(family, quotas.shares)
    stray = {f: c for f, c in counts.items() if f not in quotas.shares or c < 0}
    if stray:
        raise BatchConfigError(f"admission counts hold unknown families or negative counts: {stray}")
    n = sum(counts.values())
    have = counts.get(family, 0)
    limit = quotas.shares[family] * (n + 1) + quotas.slack
    if have + 1 <= limit + 1e-9:
        return Admission(allowed=True, reason=f"{family}: {have + 1} ≤ {limit:.2f}")
    return Admission(
        allowed=False,
        retry_after_s=quotas.retry_after_s,
        reason=(
            f"task family {family!r} is over its quota: {have} of {n} admitted episodes, "
            f"share {quotas.shares[family]:g} + slack {quotas.slack}; other families must catch up"
        ),
    )


def tenant_policy_refusal(policy: BatchPolicy) -> str | None:
    """Why a tenant cannot take ``policy`` (one line), or ``None`` when it can (`TENANT_BATCH_POLICIES`)."""
    if policy in TENANT_BATCH_POLICIES:
        return None
    names = ", ".join(p.value for p in TENANT_BATCH_POLICIES)
    return f"batch policy {policy.value} needs readiness votes, which name no tenant: tenants take {names}"
