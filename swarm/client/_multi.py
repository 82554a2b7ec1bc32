"""Multi-model episodes: one rollout that opens an episode on each of several servers.

::

    async with MultiEpisode({"planner": client_a, "executor": client_b}, task_id="t1") as eps:
        plan = await plan_with(eps["planner"].llm, task)
        answer = await execute_with(eps["executor"].llm, plan)
        await eps.finish({"planner": r_plan, "executor": r_exec})   # or one reward for all

All members begin together (if one cannot begin, the ones that did are aborted). An exception inside
the block, or leaving it without ``finish``, aborts every member (as an infrastructure failure when the
exception is one, see :mod:`swarm.client._failures`).

**Finish is all-or-abort as far as HTTP allows.** Servers have no two-phase commit, so ``finish``:

1. checks that every member is still open (a heartbeat to each; one that fails means the member is lost
   — its server restarted or reclaimed it — and then *every* member is aborted, none finished);
2. finishes the members one after another, in the mapping's order; if the first finish fails, the rest
   are aborted, so nothing is committed.

Only a failure *after* a member has committed (a server crashing between step 1 and its own finish)
leaves the others committed: :class:`PartialFinishError` names the finished members; the unfinished
ones are aborted as infrastructure failures. Heartbeats and finishes are retried on transient errors
first, so this needs a server to stay down past the client's retry deadline within that window.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx

from swarm.client._client import AsyncEpisode, AsyncSwarmClient
from swarm.client._errors import MultiEpisodeError, PartialFinishError
from swarm.client._failures import EpisodeLost, FailureKind, classify_failure
from swarm.client.workflow import LLM, Result
from swarm.errors import ClientError
from swarm.protocol import EpisodeKind, EpisodeStatus

Reward = float | Result


class MultiEpisode:
    """Episodes on several servers that finish together or abort together.

    Args:
        clients: member name → client of that member's server (two names may share a server).
        task_id: task id of every member (each server groups its member with the task's other episodes).
        kind: ``train`` or ``eval``.
        family: task family for cocktail quotas.
        metadata: sent with every member.
        trainable_agents: agent names trained, for every member, or member name → list.
    """

    def __init__(
        self,
        clients: Mapping[str, AsyncSwarmClient],
        task_id: str,
        *,
        kind: EpisodeKind | str = EpisodeKind.TRAIN,
        family: str | None = None,
        metadata: dict[str, Any] | None = None,
        trainable_agents: list[str] | Mapping[str, list[str] | None] | None = None,
    ) -> None:
        if not clients:
            raise ValueError("a multi-model episode needs at least one server")
        self._clients = dict(clients)
        self.task_id = task_id
        self._kind = kind
        self._family = family
        self._metadata = metadata
        self._trainable = trainable_agents
        self.episodes: dict[str, AsyncEpisode] = {}
        self.ended = False

    def __repr__(self) -> str:
        return f"MultiEpisode(task_id={self.task_id!r}, members={list(self._clients)}, ended={self.ended})"

    def __getitem__(self, name: str) -> AsyncEpisode:
        return self.episodes[name]

    @property
    def names(self) -> list[str]:
        return list(self._clients)

    @property
    def llms(self) -> dict[str, LLM]:
        """Member name → that episode's OpenAI-compatible endpoint."""
        return {name: ep.llm for name, ep in self.episodes.items()}

    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(ep.base_url for ep in self.episodes.values())

    def _trainable_for(self, name: str) -> list[str] | None:
        if isinstance(self._trainable, Mapping):
            return self._trainable.get(name)
        return self._trainable

    async def begin(self) -> MultiEpisode:
        """Open every member (concurrently).

        Raises:
            ClientError | httpx.TransportError: a member could not begin (after retries); the members
                that did begin are aborted first.
        """

        async def one(name: str) -> AsyncEpisode:
            ep = await self._clients[name].begin(
                self.task_id,
                kind=self._kind,
                family=self._family,
                metadata=self._metadata,
                trainable_agents=self._trainable_for(name),
            )
            self.episodes[name] = ep
            return ep

        results = await asyncio.gather(*(one(n) for n in self._clients), return_exceptions=True)
        self.episodes = {n: self.episodes[n] for n in self._clients if n in self.episodes}
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._abort_open("another member of this multi-model episode failed to begin", True)
            self.ended = True
            raise errors[0]
        return self

    async def heartbeat(self) -> None:
        """Heartbeat every member.

        Raises:
            EpisodeLost: a member's server no longer has it open (after retries).
        """
        names = list(self.episodes)
        results = await asyncio.gather(*(self.episodes[n].heartbeat() for n in names), return_exceptions=True)
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                raise EpisodeLost(self.episodes[name].id, f"{name}: {result}") from result

    async def _finish_one(self, name: str, reward: Reward) -> None:
        ep = self.episodes[name]
        try:
            await ep.finish(reward)
        except ClientError as exc:
            # A retried finish whose first try was committed answers 409: check before blaming.
            if exc.status_code != 409:
                raise
            view = await ep._client.get_episode(ep.id)
            if view.status is not EpisodeStatus.FINISHED:
                raise
            ep.ended = True

    async def finish(self, rewards: Reward | Mapping[str, Reward]) -> None:
        """Finish every member with its reward (see the module docstring for the protocol).

        Args:
            rewards: one reward (or :class:`Result`) for all members, or member name → reward.

        Raises:
            ValueError: the mapping's names differ from the members' (nothing is ended).
            MultiEpisodeError: a member was lost or could not finish; every member was aborted.
            PartialFinishError: a member failed after another had committed (see the docstring).
        """
        if self.ended:
            raise MultiEpisodeError("this multi-model episode has already ended", aborted=[], failed={})
        if isinstance(rewards, Mapping):
            if set(rewards) != set(self.episodes):
                raise ValueError(
                    f"rewards name {sorted(rewards)}, but the members are {sorted(self.episodes)}"
                )
            per_member = dict(rewards)
        else:
            per_member = dict.fromkeys(self.episodes, rewards)
        try:
            await self.heartbeat()
        except EpisodeLost as exc:
            aborted = await self._abort_open(f"multi-model episode not finished: {exc}", True)
            self.ended = True
            raise MultiEpisodeError(str(exc), aborted=aborted, failed={"heartbeat": exc}) from exc
        finished: list[str] = []
        for name in self.names:  # the mapping's order, not the order the begins answered in
            try:
                await self._finish_one(name, per_member[name])
            except (ClientError, httpx.TransportError) as exc:
                reason = f"multi-model episode: finishing member {name!r} failed ({exc})"
                aborted = await self._abort_open(reason, True)
                self.ended = True
                if finished:
                    raise PartialFinishError(
                        f"finished {finished} but {reason}; aborted {aborted}",
                        finished=finished,
                        aborted=aborted,
                        failed={name: exc},
                    ) from exc
                raise MultiEpisodeError(reason, aborted=aborted, failed={name: exc}) from exc
            finished.append(name)
        self.ended = True

    async def abort(self, reason: str = "aborted by client", *, infra_failure: bool = False) -> list[str]:
        """Abort every member still open; returns the names aborted (errors of lost members ignored)."""
        aborted = await self._abort_open(reason, infra_failure)
        self.ended = True
        return aborted

    async def _abort_open(self, reason: str, infra_failure: bool) -> list[str]:
        open_names = [n for n, ep in self.episodes.items() if not ep.ended]

        async def one(name: str) -> bool:
            # A member its server no longer knows (404/409) is already ended there: nothing to undo.
            with contextlib.suppress(ClientError, httpx.TransportError):
                await self.episodes[name].abort(reason, infra_failure=infra_failure)
                return True
            self.episodes[name].ended = True
            return False

        done = await asyncio.gather(*(one(n) for n in open_names))
        return [n for n, ok in zip(open_names, done, strict=True) if ok]

    async def __aenter__(self) -> MultiEpisode:
        return await self.begin()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.ended:
            return
        if exc is None:
            await self.abort("the multi-model episode block ended without finish()", infra_failure=False)
            return
        infra = isinstance(exc, asyncio.CancelledError) or (
            classify_failure(exc, self.base_urls) is FailureKind.INFRA
        )
        await self.abort(f"{type(exc).__name__}: {exc}"[:4000], infra_failure=infra)
