"""``SwarmClient`` / ``AsyncSwarmClient``: begin, finish and abort episodes over HTTP.

Request building and answer parsing live in :class:`_BaseClient`; the sync and async faces only send.
Transient failures (connection errors, 429, 502/503/504) are retried with exponential backoff
(tenacity). An answer with ``Retry-After`` (a full quota, a training step, a paused server) is waited
out for exactly that long and does not use up an attempt: only ``RetryPolicy.deadline_s`` bounds how
long a client keeps coming back to a busy server.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential_jitter,
)

from swarm.client._failures import FailureKind, classify_failure
from swarm.client._sse import parse_sse
from swarm.client.workflow import LLM, Result
from swarm.errors import ClientError
from swarm.protocol import (
    CheckpointSaved,
    ClientState,
    ClientTokenCreate,
    ClientTokenCreated,
    ClientTokenRevoked,
    ClientTokenView,
    ConfigChanged,
    ConfigView,
    EpisodeAbort,
    EpisodeCommit,
    EpisodeCreate,
    EpisodeCreated,
    EpisodeFinish,
    EpisodeKind,
    EpisodePrepare,
    EpisodeView,
    Event,
    ServerStepMetrics,
    StatusView,
    Vote,
    VoteCast,
)

_TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
_METRICS = TypeAdapter(list[ServerStepMetrics])
_TOKENS = TypeAdapter(list[ClientTokenView])


@dataclass(frozen=True)
class RetryPolicy:
    """How the client retries transient failures."""

    attempts: int = 8
    """Most failed tries per request (1 = no retry); answers with ``Retry-After`` do not count."""
    max_wait_s: float = 30.0
    """Largest single backoff, in seconds (also caps a server's ``Retry-After``)."""
    deadline_s: float = 300.0
    """Give up after this many seconds in total."""


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, ClientError) and exc.status_code in _TRANSIENT_STATUS


def _retry_after(exc: BaseException | None) -> float | None:
    if isinstance(exc, ClientError) and exc.status_code in _TRANSIENT_STATUS:
        return exc.retry_after_s
    return None


def _parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (RFC 9110 §10.2.3 delay-seconds form; an HTTP date counts as absent)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class _RetryWait:
    """tenacity wait: the server's ``Retry-After`` when it sent one, else exponential backoff with jitter."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._max = policy.max_wait_s
        self._backoff = wait_exponential_jitter(multiplier=0.2, max=policy.max_wait_s, jitter=0.2)

    def __call__(self, state: RetryCallState) -> float:
        after = _retry_after(state.outcome.exception() if state.outcome else None)
        if after is not None:
            return min(after, self._max)
        return float(self._backoff(state))


class _RetryStop:
    """tenacity stop: ``attempts`` failed tries not counting busy answers, or ``deadline_s`` in total.

    One instance per request (it counts that request's busy answers).
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._busy = 0

    def __call__(self, state: RetryCallState) -> bool:
        if _retry_after(state.outcome.exception() if state.outcome else None) is not None:
            self._busy += 1
        if state.seconds_since_start is not None and state.seconds_since_start >= self._policy.deadline_s:
            return True
        return state.attempt_number - self._busy >= self._policy.attempts


def _is_infra(exc: BaseException, base_url: str) -> bool:
    """Whether an exception that ends an ``episode()`` block is an infrastructure failure."""
    if not isinstance(exc, Exception):  # cancellation, Ctrl-C: the client stopped, not the agent
        return True
    return classify_failure(exc, (base_url,)) is FailureKind.INFRA


def _bearer(secret: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


class _BaseClient:
    """Credentials (docs/ARCHITECTURE.md §Credentials and limits): the admin token goes to control
    routes; begin sends the client token (else the admin token); an episode's routes send its episode key
    while this client knows it (from its own begin), else the client token, else the admin token."""

    client_id: str

    def __init__(
        self, url: str, admin_token: str | None, retry: RetryPolicy, client_token: str | None
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry
        self._headers = _bearer(admin_token)
        self._begin_headers = _bearer(client_token or admin_token)
        self._keys: dict[str, str] = {}
        """Episode keys of the episodes this client began and has not ended, by episode id."""

    def _episode_headers(self, episode_id: str) -> dict[str, str]:
        key = self._keys.get(episode_id)
        return _bearer(key) if key is not None else self._begin_headers

    def _began(self, body: Any) -> EpisodeCreated:
        created = EpisodeCreated.model_validate(body)
        self._keys[created.episode_id] = created.api_key
        return created

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    @staticmethod
    def _check(response: httpx.Response) -> Any:
        """The JSON body of a success answer.

        Raises:
            ClientError: the server answered an error (its ``{"error": ...}`` message, status and type).
        """
        _BaseClient._check_status(response)
        return response.json()

    @staticmethod
    def _check_status(response: httpx.Response) -> None:
        if response.is_success:
            return
        try:
            error = response.json().get("error", {})
            message, kind = error.get("message", response.text), error.get("type", "")
        except ValueError:
            message, kind = response.text, ""
        raise ClientError(
            f"{response.request.method} {response.request.url.path} → {response.status_code}: {message}",
            status_code=response.status_code,
            error_type=kind,
            url=str(response.request.url),
            retry_after_s=_parse_retry_after(response.headers.get("retry-after")),
        )

    def _client_path(self, action: str = "") -> str:
        """``/api/v1/clients/{client_id}[/action]`` with the id percent-encoded."""
        path = "/api/v1/clients/" + quote(self.client_id, safe="")
        return f"{path}/{action}" if action else path

    def _retry_kwargs(self) -> dict[str, Any]:
        return {
            "retry": retry_if_exception(_is_transient),
            "stop": _RetryStop(self.retry),
            "wait": _RetryWait(self.retry),
            "reraise": True,
        }

    @staticmethod
    def _begin_body(
        task_id: str,
        client_id: str,
        kind: EpisodeKind | str,
        family: str | None,
        metadata: dict[str, Any] | None,
        trainable_agents: list[str] | None,
    ) -> dict[str, Any]:
        return EpisodeCreate(
            task_id=task_id,
            client_id=client_id,
            kind=EpisodeKind(kind),
            family=family,
            metadata=metadata or {},
            trainable_agents=trainable_agents,
        ).model_dump(mode="json")

    @staticmethod
    def _events(response: httpx.Response) -> list[Event]:
        _BaseClient._check_status(response)
        return [Event.model_validate(data) for data in parse_sse(response.text)]

    @staticmethod
    def _finish_body(result: float | Result) -> dict[str, Any]:
        if isinstance(result, Result):
            return EpisodeFinish(
                reward=result.reward, agent_rewards=result.agent_rewards, metrics=result.metrics
            ).model_dump()
        return EpisodeFinish(reward=float(result)).model_dump()


class _EpisodeBase:
    """What an open episode knows: its id, endpoint, secret key and model (shared by both faces)."""

    def __init__(self, created: EpisodeCreated) -> None:
        self.id = created.episode_id
        self.base_url = created.base_url
        self.api_key = created.api_key
        self.model = created.model
        self.llm = LLM(base_url=self.base_url, api_key=self.api_key, model=self.model)
        self.ended = False

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.base_url!r}, ended={self.ended})"


class Episode(_EpisodeBase):
    """An open episode (sync). ``llm`` is what an OpenAI-compatible agent needs."""

    def __init__(self, client: SwarmClient, created: EpisodeCreated) -> None:
        super().__init__(created)
        self._client = client

    def finish(self, reward: float | Result) -> None:
        """End with a reward (or a :class:`Result`); committed server-side when this returns."""
        self._client.finish(self.id, reward)
        self.ended = True

    def abort(self, reason: str = "aborted by client", *, infra_failure: bool = False) -> None:
        self._client.abort(self.id, reason, infra_failure=infra_failure)
        self.ended = True

    def heartbeat(self) -> None:
        self._client.heartbeat(self.id)


class SwarmClient(_BaseClient):
    """Blocking client of one swarm server.

    Args:
        url: server root, e.g. ``http://127.0.0.1:8000``.
        admin_token: for control routes (status, config, client tokens); also acts as a client token.
        client_token: begins episodes on a server with client tokens (and finishes or reads the
            episodes it began).
        client_id: reported with every episode (for ``all_clients_ready`` votes and ``swarm top``).
        timeout_s: per-request timeout in seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        client_token: str | None = None,
        client_id: str = "anonymous",
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, admin_token, retry or RetryPolicy(), client_token)
        self.client_id = client_id
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        json: Any = None,
        admin: bool = False,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        headers = self._headers if admin else (headers or {})
        for attempt in Retrying(**self._retry_kwargs()):
            with attempt:
                return self._check(
                    self._http.request(method, path, json=json, params=params, headers=headers)
                )
        raise AssertionError("unreachable")  # pragma: no cover - tenacity reraises

    def begin(
        self,
        task_id: str,
        *,
        kind: EpisodeKind | str = EpisodeKind.TRAIN,
        family: str | None = None,
        metadata: dict[str, Any] | None = None,
        trainable_agents: list[str] | None = None,
    ) -> Episode:
        body = self._begin_body(task_id, self.client_id, kind, family, metadata, trainable_agents)
        answer = self._request("POST", "/api/v1/episodes", body, headers=self._begin_headers)
        return Episode(self, self._began(answer))

    def finish(self, episode_id: str, reward: float | Result) -> None:
        path = f"/api/v1/episodes/{episode_id}/finish"
        self._request("POST", path, self._finish_body(reward), headers=self._episode_headers(episode_id))
        self._keys.pop(episode_id, None)

    def abort(
        self, episode_id: str, reason: str = "aborted by client", *, infra_failure: bool = False
    ) -> None:
        body = EpisodeAbort(reason=reason[:4000], infra_failure=infra_failure).model_dump()
        path = f"/api/v1/episodes/{episode_id}/abort"
        self._request("POST", path, body, headers=self._episode_headers(episode_id))
        self._keys.pop(episode_id, None)

    def heartbeat(self, episode_id: str) -> None:
        path = f"/api/v1/episodes/{episode_id}/heartbeat"
        self._request("POST", path, headers=self._episode_headers(episode_id))

    def get_episode(self, episode_id: str) -> EpisodeView:
        headers = self._episode_headers(episode_id) or self._headers
        return EpisodeView.model_validate(
            self._request("GET", f"/api/v1/episodes/{episode_id}", headers=headers)
        )

    def status(self) -> StatusView:
        return StatusView.model_validate(self._request("GET", "/api/v1/status", admin=True))

    def metrics(self, since_step: int = 0) -> list[ServerStepMetrics]:
        """Per-step training metrics after policy version ``since_step`` (``GET /api/v1/metrics``),
        oldest first; empty while no step has run or when the server only serves.

        Raises:
            ClientError: the server answered an error (401/403 without the admin token).
            httpx.TransportError: the server could not be reached (after the retries).
        """
        body = self._request("GET", "/api/v1/metrics", params={"since_step": since_step}, admin=True)
        return _METRICS.validate_python(body)

    def events(self, since: int = 0) -> list[Event]:
        """The server's buffered events after sequence number ``since`` (``GET /api/v1/events`` without
        following), oldest first. Pass the last ``seq`` seen to read only new ones; a restarted server
        numbers from 1 again.

        Raises:
            ClientError: the server answered an error (401/403 without the admin token).
            httpx.TransportError: the server could not be reached (after the retries).
        """
        params: dict[str, int | str] = {"since": since, "follow": "false"}
        for attempt in Retrying(**self._retry_kwargs()):
            with attempt:
                return self._events(self._http.get("/api/v1/events", params=params, headers=self._headers))
        raise AssertionError("unreachable")  # pragma: no cover - tenacity reraises

    def config(self) -> ConfigView:
        """The configuration the server's next step will use (``GET /api/v1/config``).

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        return ConfigView.model_validate(self._request("GET", "/api/v1/config", admin=True))

    def patch_config(self, **changes: Any) -> ConfigChanged:
        """Change live settings (``PATCH /api/v1/config``), e.g. ``quotas={"math": 0.5, "code": 0.5}``;
        they take effect from the next step.

        Args:
            changes: fields of :class:`~swarm.protocol.ConfigPatch`.

        Raises:
            ClientError: 422 for an unknown field, a bad value or an invalid combination; 409 when the
                server does not train.
        """
        body = self._request("PATCH", "/api/v1/config", changes, admin=True)
        return ConfigChanged.model_validate(body)

    def checkpoint(self) -> CheckpointSaved:
        """Save a checkpoint now (``POST /api/v1/checkpoint``; waits for a running step to end).

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        return CheckpointSaved.model_validate(self._request("POST", "/api/v1/checkpoint", admin=True))

    def client_tokens(self) -> list[ClientTokenView]:
        """The server's client tokens by name, with their open episodes (admin; never the secrets)."""
        return _TOKENS.validate_python(self._request("GET", "/api/v1/client-tokens", admin=True))

    def add_client_token(self, name: str, token: str | None = None) -> ClientTokenCreated:
        """Add a client token live (admin); ``token=None`` lets the server mint one (the answer has it).

        Raises:
            ClientError: 409 when the name or the secret is taken.
        """
        body = ClientTokenCreate(name=name, token=token).model_dump(exclude_none=True)
        return ClientTokenCreated.model_validate(
            self._request("POST", "/api/v1/client-tokens", body, admin=True)
        )

    def revoke_client_token(self, name: str) -> ClientTokenRevoked:
        """Revoke a client token live (admin).

        Raises:
            ClientError: 404 when no token has this name.
        """
        answer = self._request("DELETE", f"/api/v1/client-tokens/{name}", admin=True)
        return ClientTokenRevoked.model_validate(answer)

    def vote_ready(self, ready: bool = True) -> VoteCast:
        """Vote that this client's round is done (``POST /api/v1/clients/{client_id}/ready``), for the
        ``all_clients_ready`` / ``any_client_ready`` batch policies; ``ready=False`` withdraws the vote.
        Votes are cleared by the step they produce. No admin token needed.

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        body = self._request(
            "POST", self._client_path("ready"), Vote(ready=ready).model_dump(), headers=self._begin_headers
        )
        return VoteCast.model_validate(body)

    def client_heartbeat(self) -> ClientState:
        """Keep this client active for the voting policies while it has no episode open
        (``POST /api/v1/clients/{client_id}/heartbeat``).

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        return ClientState.model_validate(
            self._request("POST", self._client_path("heartbeat"), headers=self._begin_headers)
        )

    def leave(self) -> ClientState:
        """Say goodbye (``DELETE /api/v1/clients/{client_id}``): this client and its vote stop counting for
        the voting policies; its finished episodes are still trained.

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        return ClientState.model_validate(
            self._request("DELETE", self._client_path(), headers=self._begin_headers)
        )

    @contextlib.contextmanager
    def episode(self, task_id: str, **kwargs: Any) -> Iterator[Episode]:
        """Open an episode for the block; an exception inside aborts it (and is re-raised).

        The abort is an infrastructure failure (``infra_failure=true``) when the exception is one (see
        :func:`swarm.client.classify_failure`) or the block was cancelled/interrupted.

        Leaving the block without ``ep.finish(...)`` aborts the episode too: an episode never stays open.
        """
        ep = self.begin(task_id, **kwargs)
        try:
            yield ep
        except BaseException as exc:
            if not ep.ended:
                with contextlib.suppress(ClientError, httpx.TransportError):
                    ep.abort(f"{type(exc).__name__}: {exc}", infra_failure=_is_infra(exc, ep.base_url))
            raise
        if not ep.ended:
            ep.abort("the episode block ended without finish()")


class AsyncEpisode(_EpisodeBase):
    """An open episode (async)."""

    def __init__(self, client: AsyncSwarmClient, created: EpisodeCreated) -> None:
        super().__init__(created)
        self._client = client

    async def finish(self, reward: float | Result) -> None:
        await self._client.finish(self.id, reward)
        self.ended = True

    async def abort(self, reason: str = "aborted by client", *, infra_failure: bool = False) -> None:
        await self._client.abort(self.id, reason, infra_failure=infra_failure)
        self.ended = True

    async def heartbeat(self) -> None:
        await self._client.heartbeat(self.id)


class AsyncSwarmClient(_BaseClient):
    """Async twin of :class:`SwarmClient` (same arguments)."""

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        client_token: str | None = None,
        client_id: str = "anonymous",
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, admin_token, retry or RetryPolicy(), client_token)
        self.client_id = client_id
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout_s, transport=transport, limits=limits
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSwarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        json: Any = None,
        admin: bool = False,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        headers = self._headers if admin else (headers or {})
        async for attempt in AsyncRetrying(**self._retry_kwargs()):
            with attempt:
                response = await self._http.request(method, path, json=json, params=params, headers=headers)
                return self._check(response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def begin(
        self,
        task_id: str,
        *,
        kind: EpisodeKind | str = EpisodeKind.TRAIN,
        family: str | None = None,
        metadata: dict[str, Any] | None = None,
        trainable_agents: list[str] | None = None,
    ) -> AsyncEpisode:
        body = self._begin_body(task_id, self.client_id, kind, family, metadata, trainable_agents)
        answer = await self._request("POST", "/api/v1/episodes", body, headers=self._begin_headers)
        return AsyncEpisode(self, self._began(answer))

    async def finish(self, episode_id: str, reward: float | Result) -> None:
        path = f"/api/v1/episodes/{episode_id}/finish"
        await self._request(
            "POST", path, self._finish_body(reward), headers=self._episode_headers(episode_id)
        )
        self._keys.pop(episode_id, None)

    async def abort(
        self, episode_id: str, reason: str = "aborted by client", *, infra_failure: bool = False
    ) -> None:
        body = EpisodeAbort(reason=reason[:4000], infra_failure=infra_failure).model_dump()
        path = f"/api/v1/episodes/{episode_id}/abort"
        await self._request("POST", path, body, headers=self._episode_headers(episode_id))
        self._keys.pop(episode_id, None)

    async def heartbeat(self, episode_id: str) -> None:
        path = f"/api/v1/episodes/{episode_id}/heartbeat"
        await self._request("POST", path, headers=self._episode_headers(episode_id))

    async def prepare(
        self,
        episode_id: str,
        reward: float | Result,
        *,
        txn_id: str,
        primary_url: str | None = None,
        primary_episode_id: str | None = None,
    ) -> None:
        """Phase one of a multi-server finish (``POST …/prepare``; see :class:`~swarm.client.MultiEpisode`):
        the episode is stored with its reward, not trainable until :meth:`commit`. ``primary_url`` and
        ``primary_episode_id`` name the primary member (leave them out on the primary itself).

        Raises:
            ClientError: 409 when the episode has ended otherwise, 404 when the server does not know it.
        """
        body = EpisodePrepare(
            **self._finish_body(reward),
            txn_id=txn_id,
            primary_url=primary_url,
            primary_episode_id=primary_episode_id,
        ).model_dump()
        path = f"/api/v1/episodes/{episode_id}/prepare"
        await self._request("POST", path, body, headers=self._episode_headers(episode_id))

    async def commit(self, episode_id: str, txn_id: str) -> None:
        """Phase two (``POST …/commit``): the prepared episode becomes finished; idempotent.

        Raises:
            ClientError: 409 when the transaction was aborted on that server.
        """
        body = EpisodeCommit(txn_id=txn_id).model_dump()
        path = f"/api/v1/episodes/{episode_id}/commit"
        await self._request("POST", path, body, headers=self._episode_headers(episode_id))
        self._keys.pop(episode_id, None)

    async def get_episode(self, episode_id: str) -> EpisodeView:
        headers = self._episode_headers(episode_id) or self._headers
        answer = await self._request("GET", f"/api/v1/episodes/{episode_id}", headers=headers)
        return EpisodeView.model_validate(answer)

    async def status(self) -> StatusView:
        return StatusView.model_validate(await self._request("GET", "/api/v1/status", admin=True))

    async def metrics(self, since_step: int = 0) -> list[ServerStepMetrics]:
        """Async :meth:`SwarmClient.metrics`."""
        body = await self._request("GET", "/api/v1/metrics", params={"since_step": since_step}, admin=True)
        return _METRICS.validate_python(body)

    async def events(self, since: int = 0) -> list[Event]:
        """Async :meth:`SwarmClient.events`."""
        params: dict[str, int | str] = {"since": since, "follow": "false"}
        async for attempt in AsyncRetrying(**self._retry_kwargs()):
            with attempt:
                response = await self._http.get("/api/v1/events", params=params, headers=self._headers)
                return self._events(response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def config(self) -> ConfigView:
        """Async :meth:`SwarmClient.config`."""
        return ConfigView.model_validate(await self._request("GET", "/api/v1/config", admin=True))

    async def patch_config(self, **changes: Any) -> ConfigChanged:
        """Async :meth:`SwarmClient.patch_config`."""
        body = await self._request("PATCH", "/api/v1/config", changes, admin=True)
        return ConfigChanged.model_validate(body)

    async def checkpoint(self) -> CheckpointSaved:
        """Async :meth:`SwarmClient.checkpoint`."""
        return CheckpointSaved.model_validate(await self._request("POST", "/api/v1/checkpoint", admin=True))

    async def client_tokens(self) -> list[ClientTokenView]:
        """Async :meth:`SwarmClient.client_tokens`."""
        return _TOKENS.validate_python(await self._request("GET", "/api/v1/client-tokens", admin=True))

    async def add_client_token(self, name: str, token: str | None = None) -> ClientTokenCreated:
        """Async :meth:`SwarmClient.add_client_token`."""
        body = ClientTokenCreate(name=name, token=token).model_dump(exclude_none=True)
        answer = await self._request("POST", "/api/v1/client-tokens", body, admin=True)
        return ClientTokenCreated.model_validate(answer)

    async def revoke_client_token(self, name: str) -> ClientTokenRevoked:
        """Async :meth:`SwarmClient.revoke_client_token`."""
        answer = await self._request("DELETE", f"/api/v1/client-tokens/{name}", admin=True)
        return ClientTokenRevoked.model_validate(answer)

    async def vote_ready(self, ready: bool = True) -> VoteCast:
        """Async :meth:`SwarmClient.vote_ready`."""
        path = self._client_path("ready")
        return VoteCast.model_validate(
            await self._request("POST", path, Vote(ready=ready).model_dump(), headers=self._begin_headers)
        )

    async def client_heartbeat(self) -> ClientState:
        """Async :meth:`SwarmClient.client_heartbeat`."""
        path = self._client_path("heartbeat")
        return ClientState.model_validate(await self._request("POST", path, headers=self._begin_headers))

    async def leave(self) -> ClientState:
        """Async :meth:`SwarmClient.leave`."""
        return ClientState.model_validate(
            await self._request("DELETE", self._client_path(), headers=self._begin_headers)
        )

    @contextlib.asynccontextmanager
    async def episode(self, task_id: str, **kwargs: Any) -> AsyncIterator[AsyncEpisode]:
        """Async :meth:`SwarmClient.episode`: an exception inside aborts the episode."""
        ep = await self.begin(task_id, **kwargs)
        try:
            yield ep
        except BaseException as exc:
            if not ep.ended:
                with contextlib.suppress(ClientError, httpx.TransportError):
                    await ep.abort(f"{type(exc).__name__}: {exc}", infra_failure=_is_infra(exc, ep.base_url))
            raise
        if not ep.ended:
            await ep.abort("the episode block ended without finish()")
