"""Multi-model episodes: one rollout that opens an episode on each of several servers.

::

    async with MultiEpisode({"planner": client_a, "executor": client_b}, task_id="t1") as eps:
        plan = await plan_with(eps["planner"].llm, task)
        answer = await execute_with(eps["executor"].llm, plan)
        await eps.finish({"planner": r_plan, "executor": r_exec})   # or one reward for all

All members begin together (if one cannot begin, the ones that did are aborted). An exception inside
the block, or leaving it without ``finish``, aborts every member (as an infrastructure failure when the
exception is one, see :mod:`swarm.client._failures`).

**Finish is atomic across servers** (docs/ARCHITECTURE.md §Multi-server finish). With one member it
is a plain finish. With several, ``finish`` runs a two-phase commit with a shared transaction id and a
*primary* member (the first in the mapping), Percolator's rule (Peng & Dabek, OSDI 2010):

1. *prepare* every member (concurrently): each server stores its member ``prepared`` with its reward,
   naming the transaction and the primary; a prepared episode is never trained as it is. If any prepare
   fails, every member is aborted (the primary was never committed, so nothing can commit) and
   :class:`MultiEpisodeError` is raised.
2. *commit the primary*: the commit point, one compare-and-set on one server. If its server answers that
   the transaction aborted (409: it expired), the others are aborted; if no answer comes (the server died
   mid-commit), the outcome is unknown here and :class:`UndecidedFinishError` is raised without aborting
   anything: the servers settle it.
3. *commit the others*; one that cannot be reached is left to its server, which reads the primary's fate
   once back (`swarm.server.transactions`); ``unconfirmed`` names those members.

A prepared member left undecided (the client died between the phases) is resolved by the servers after
their ``prepare_timeout_s``: the primary aborts itself, a secondary follows its primary. So every member
ends ``finished`` or none does, whichever process dies when. Prepares and commits are retried on
transient errors and are idempotent (a retried request whose first try landed answers the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, NoReturn

import httpx

from swarm.client._client import AsyncEpisode, AsyncSwarmClient
from swarm.client._errors import MultiEpisodeError, UndecidedFinishError
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
        tenant: the LoRA tenant every member is begun under (servers with ``--tenants``); ``None``: the
            servers' one policy.
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
        tenant: str | None = None,
    ) -> None:
        if not clients:
            raise ValueError("a multi-model episode needs at least one server")
        self._clients = dict(clients)
        self.task_id = task_id
        self._kind = kind
        self._family = family
        self._metadata = metadata
        self._trainable = trainable_agents
        self._tenant = tenant
        self.episodes: dict[str, AsyncEpisode] = {}
        self.ended = False
        self.unconfirmed: list[str] = []
        """After ``finish``: members whose commit got no answer (their servers finish them from the
        primary once back)."""

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
                tenant=self._tenant,
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

    async def finish(self, rewards: Reward | Mapping[str, Reward]) -> None:
        """Finish every member with its reward, atomically across servers (see the module docstring).

        Args:
            rewards: one reward (or :class:`Result`) for all members, or member name → reward.

        Raises:
            ValueError: the mapping's names differ from the members' (nothing is ended).
            MultiEpisodeError: a member was lost or could not finish; every member was aborted.
            UndecidedFinishError: the primary's commit got no answer; the servers settle the outcome (all
                members finished, or none).
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
        if len(self.episodes) == 1:
            await self._finish_single(per_member)
        else:
            await self._finish_atomic(per_member)
        self.ended = True

    async def _finish_single(self, per_member: dict[str, Reward]) -> None:
        ((name, ep),) = self.episodes.items()
        try:
            await ep.finish(per_member[name])
        except ClientError as exc:
            # A retried finish whose first try was committed answers 409: check before blaming.
            if exc.status_code == 409 and await self._status(name) is EpisodeStatus.FINISHED:
                ep.ended = True
                return
            await self._fail(f"finishing member {name!r} failed ({exc})", {name: exc})
        except httpx.TransportError as exc:
            await self._fail(f"finishing member {name!r} failed ({exc})", {name: exc})

    async def _finish_atomic(self, per_member: dict[str, Reward]) -> None:
        txn_id = "txn-" + uuid.uuid4().hex
        primary = self.names[0]
        primary_ep = self.episodes[primary]
        primary_url = self._clients[primary].url

        async def prepare(name: str) -> None:
            ep = self.episodes[name]
            if name == primary:
                await self._clients[name].prepare(ep.id, per_member[name], txn_id=txn_id)
            else:
                await self._clients[name].prepare(
                    ep.id,
                    per_member[name],
                    txn_id=txn_id,
                    primary_url=primary_url,
                    primary_episode_id=primary_ep.id,
                )

        results = await asyncio.gather(*(prepare(n) for n in self.names), return_exceptions=True)
        failed = {n: r for n, r in zip(self.names, results, strict=True) if isinstance(r, BaseException)}
        if failed:  # nothing committed, and only this client commits a primary: abort them all
            name, exc = next(iter(failed.items()))
            await self._fail(f"preparing member {name!r} failed ({exc})", failed)
        try:
            await self._clients[primary].commit(primary_ep.id, txn_id)
        except ClientError as exc:
            if exc.status_code in (404, 409):  # aborted there (it expired): the transaction is aborted
                await self._fail(f"the primary member {primary!r} did not commit ({exc})", {primary: exc})
            self._settled_by_servers()
            raise UndecidedFinishError(txn_id, primary, exc) from exc
        except httpx.TransportError as exc:
            self._settled_by_servers()
            raise UndecidedFinishError(txn_id, primary, exc) from exc
        for ep in self.episodes.values():
            ep.ended = True
        secondaries = self.names[1:]
        done = await asyncio.gather(
            *(self._clients[n].commit(self.episodes[n].id, txn_id) for n in secondaries),
            return_exceptions=True,
        )
        self.unconfirmed = [n for n, r in zip(secondaries, done, strict=True) if isinstance(r, BaseException)]

    def _settled_by_servers(self) -> None:
        """From here on the servers decide: leaving the block must abort nothing."""
        self.ended = True
        for ep in self.episodes.values():
            ep.ended = True

    async def _status(self, name: str) -> EpisodeStatus | None:
        with contextlib.suppress(ClientError, httpx.TransportError):
            return (await self._clients[name].get_episode(self.episodes[name].id)).status
        return None

    async def _fail(self, reason: str, failed: Mapping[str, BaseException]) -> NoReturn:
        aborted = await self._abort_open(f"multi-model episode not finished: {reason}", True)
        self.ended = True
        cause = next(iter(failed.values()))
        raise MultiEpisodeError(reason, aborted=aborted, failed=dict(failed)) from cause

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
