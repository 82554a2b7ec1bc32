"""``AsyncSwarmClient``: the one implementation of the swarm client (episodes and control routes over HTTP).

Every request is built, sent, retried and parsed here; :class:`~swarm.client.SwarmClient` is a blocking
face that runs this same client on a private event loop (`swarm.client._sync`), so both faces share one
set of timeouts (:class:`Timeouts`), one retry policy and one set of error types.

Transient failures (connection errors, 429, 502/503/504) are retried with exponential backoff
(tenacity). An answer with ``Retry-After`` (a full quota, a training step, a paused server) is waited
out for exactly that long and does not use up an attempt: only ``RetryPolicy.deadline_s`` bounds how
long a client keeps coming back to a busy server. A paused server or tenant (an answer of type
``paused``) is retried the same way, and logged once per request (WARNING, with its reason).
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

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
    TenantCreate,
    TenantView,
    Vote,
    VoteCast,
)

_TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
logger = logging.getLogger(__name__)
_METRICS = TypeAdapter(list[ServerStepMetrics])
_TOKENS = TypeAdapter(list[ClientTokenView])
_TENANTS = TypeAdapter(list[TenantView])
_MAX_REASON_CHARS = 4000
"""An abort's reason is cut to this many characters (the server's limit)."""


def _tenant_path(tenant_id: str, action: str = "") -> str:
    """``/api/v1/tenants/{id}[/{action}]`` with the id quoted."""
    path = "/api/v1/tenants/" + quote(tenant_id, safe="")
    return f"{path}/{action}" if action else path


@dataclass(frozen=True)
class Timeouts:
    """How long one HTTP request of a swarm client may take, in seconds, by phase (httpx's four).

    The same for the blocking and the async client. ``timeout_s=`` of either client sets all four to one
    value (:meth:`uniform`).
    """

    connect_s: float = 10.0
    """Opening a connection: a server that is up accepts at once and one that is down refuses at once;
    this covers a few lost SYNs on a loaded machine (then the request is retried as transient)."""
    read_s: float = 600.0
    """Waiting for the answer once the request is sent: a finish returns once its episode is committed
    to the pool and a checkpoint waits for a running training step, so this is long; a hung server is
    bounded by :class:`RetryPolicy` and the server's own episode timeouts."""
    write_s: float = 60.0
    """Sending the request body (at most the server's ``--max-body-bytes``, 8 MiB by default)."""
    pool_s: float = 600.0
    """Waiting for a free connection of the client's pool (``MAX_CONNECTIONS``), which the runner's N
    concurrent episodes share."""

    @classmethod
    def uniform(cls, seconds: float) -> Timeouts:
        """Every phase bounded by ``seconds`` (a client's ``timeout_s=``)."""
        return cls(connect_s=seconds, read_s=seconds, write_s=seconds, pool_s=seconds)

    def to_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_s, read=self.read_s, write=self.write_s, pool=self.pool_s)


MAX_CONNECTIONS = 1000
"""Most connections one client holds open to its server (the runner runs up to N episodes at once)."""
MAX_KEEPALIVE_CONNECTIONS = 200
"""Most idle connections kept for reuse."""


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


class _PausedNotice:
    """tenacity before_sleep: log (WARNING, once per request) that the server or the tenant is paused, so a
    caller that keeps coming back to it is told why it waits, and for how long at most.

    One instance per request."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._deadline_s = policy.deadline_s
        self._told = False

    def __call__(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if self._told or not isinstance(exc, ClientError) or exc.error_type != "paused":
            return
        self._told = True
        logger.warning("%s; retrying until it is resumed, for up to %g s", exc, self._deadline_s)


def _is_infra(exc: BaseException, base_url: str) -> bool:
    """Whether an exception that ends an ``episode()`` block is an infrastructure failure."""
    if not isinstance(exc, Exception):  # cancellation, Ctrl-C: the client stopped, not the agent
        return True
    return classify_failure(exc, (base_url,)) is FailureKind.INFRA


KEYS_KEPT = 65536
"""Episode keys a client keeps (about 100 bytes each); an older episode is reached with the client or admin
token."""


def _bearer(secret: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def _check_status(response: httpx.Response) -> None:
    """Return on a success answer.

    Raises:
        ClientError: the server answered an error (its ``{"error": ...}`` message, status and type, and
            its ``Retry-After`` in seconds when it sent one).
    """
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


def _json(response: httpx.Response) -> Any:
    """The JSON body of a success answer (raises :class:`ClientError` for an error answer)."""
    _check_status(response)
    return response.json()


def _events(response: httpx.Response) -> list[Event]:
    """The events of a non-following ``GET /api/v1/events`` answer (server-sent events)."""
    _check_status(response)
    return [Event.model_validate(data) for data in parse_sse(response.text)]


def _finish_body(result: float | Result) -> dict[str, Any]:
    if isinstance(result, Result):
        return EpisodeFinish(
            reward=result.reward, agent_rewards=result.agent_rewards, metrics=result.metrics
        ).model_dump()
    return EpisodeFinish(reward=float(result)).model_dump()


class AsyncEpisode:
    """An open episode: its id, endpoint, secret key and model; ``llm`` is what an OpenAI-compatible agent
    needs. ``ended`` turns true once this client has finished or aborted it."""

    def __init__(self, client: AsyncSwarmClient, created: EpisodeCreated) -> None:
        self._client = client
        self.id = created.episode_id
        self.base_url = created.base_url
        self.api_key = created.api_key
        self.model = created.model
        self.llm = LLM(base_url=self.base_url, api_key=self.api_key, model=self.model)
        self.ended = False

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.base_url!r}, ended={self.ended})"

    async def finish(self, reward: float | Result) -> None:
        """End with a reward (or a :class:`Result`); committed server-side when this returns."""
        await self._client.finish(self.id, reward)
        self.ended = True

    async def abort(self, reason: str = "aborted by client", *, infra_failure: bool = False) -> None:
        """End without a reward (``infra_failure``: not the agent's fault, kept out of its group)."""
        await self._client.abort(self.id, reason, infra_failure=infra_failure)
        self.ended = True

    async def heartbeat(self) -> None:
        """Keep the episode from being reclaimed by the server's episode timeout."""
        await self._client.heartbeat(self.id)


class ClientOptions(TypedDict, total=False):
    """The keyword options of :class:`AsyncSwarmClient` (and of the blocking face, which forwards them)."""

    admin_token: str | None
    client_token: str | None
    client_id: str
    timeout_s: float | None
    retry: RetryPolicy | None
    transport: httpx.AsyncBaseTransport | None


class AsyncSwarmClient:
    """Client of one swarm server (async; :class:`~swarm.client.SwarmClient` is its blocking face).

    Credentials (docs/ARCHITECTURE.md §Credentials and limits): the admin token goes to control routes;
    begin sends the client token (else the admin token); an episode's routes send its episode key while
    this client knows it (from its own begin, kept after the episode ends), else the client token, else
    the admin token.

    Args:
        url: server root, e.g. ``http://127.0.0.1:8000``.
        admin_token: for control routes (status, config, client tokens); also acts as a client token.
        client_token: begins episodes on a server with client tokens (and finishes or reads the
            episodes it began).
        client_id: reported with every episode (for ``all_clients_ready`` votes and ``swarm top``).
        timeout_s: bound every phase of a request (connect, read, write, pool) by this many seconds;
            default: :class:`Timeouts`.
        retry: how transient failures are retried (default: :class:`RetryPolicy`).
        transport: an httpx async transport to send through (tests: ``httpx.MockTransport``).
    """

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        client_token: str | None = None,
        client_id: str = "anonymous",
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.client_id = client_id
        self.retry = retry or RetryPolicy()
        self.timeouts = Timeouts() if timeout_s is None else Timeouts.uniform(timeout_s)
        self._transport = transport
        self._headers = _bearer(admin_token)
        self._begin_headers = _bearer(client_token or admin_token)
        self._keys: OrderedDict[str, str] = OrderedDict()
        """Episode keys of the last `KEYS_KEPT` episodes this client began, by episode id (kept after they
        end: the key is what reads an ended episode on a server without client tokens)."""
        self._http = self._connect()

    def _connect(self) -> httpx.AsyncClient:
        """A fresh connection pool (the blocking face makes a new one in a forked child)."""
        limits = httpx.Limits(
            max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS
        )
        return httpx.AsyncClient(
            base_url=self.url, timeout=self.timeouts.to_httpx(), transport=self._transport, limits=limits
        )

    def _reconnect(self) -> None:
        """A new connection pool in a forked child; the parent's is dropped unclosed (its sockets are
        the parent's)."""
        self._http = self._connect()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSwarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _episode_headers(self, episode_id: str) -> dict[str, str]:
        key = self._keys.get(episode_id)
        return _bearer(key) if key is not None else self._begin_headers

    def _client_path(self, action: str = "") -> str:
        """``/api/v1/clients/{client_id}[/action]`` with the id percent-encoded."""
        path = "/api/v1/clients/" + quote(self.client_id, safe="")
        return f"{path}/{action}" if action else path

    async def _request(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        admin: bool = False,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        parse: Callable[[httpx.Response], Any] = _json,
    ) -> Any:
        """Send one request (retried per :attr:`retry`) and parse its answer.

        Raises:
            ClientError: the server answered an error (after the retries for a transient one).
            httpx.TransportError: the server could not be reached (after the retries).
        """
        headers = self._headers if admin else (headers or {})
        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_transient),
            stop=_RetryStop(self.retry),
            wait=_RetryWait(self.retry),
            before_sleep=_PausedNotice(self.retry),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response = await self._http.request(method, path, json=json, params=params, headers=headers)
                return parse(response)
        raise AssertionError("unreachable")  # pragma: no cover - tenacity reraises

    async def _episode_request(self, episode_id: str, action: str, body: Any = None) -> None:
        """``POST /api/v1/episodes/{episode_id}/{action}`` with the episode's credential."""
        path = f"/api/v1/episodes/{episode_id}/{action}"
        await self._request("POST", path, body, headers=self._episode_headers(episode_id))

    async def begin(
        self,
        task_id: str,
        *,
        kind: EpisodeKind | str = EpisodeKind.TRAIN,
        family: str | None = None,
        metadata: dict[str, Any] | None = None,
        trainable_agents: list[str] | None = None,
        tenant: str | None = None,
    ) -> AsyncEpisode:
        """Open an episode of task ``task_id`` (``POST /api/v1/episodes``); the server groups episodes by
        task id (GRPO). ``tenant``: the LoRA tenant it samples and trains under (a server with
        ``--tenants``).

        Raises:
            ClientError: 422 for an invalid request, 429 when a quota stays full (after the retries),
                401/403 without a valid token.
        """
        body = EpisodeCreate(
            task_id=task_id,
            client_id=self.client_id,
            kind=EpisodeKind(kind),
            family=family,
            metadata=metadata or {},
            trainable_agents=trainable_agents,
            tenant=tenant,
        ).model_dump(mode="json", exclude=None if tenant is not None else {"tenant"})
        answer = await self._request("POST", "/api/v1/episodes", body, headers=self._begin_headers)
        created = EpisodeCreated.model_validate(answer)
        self._keys[created.episode_id] = created.api_key
        if len(self._keys) > KEYS_KEPT:
            self._keys.popitem(last=False)
        return AsyncEpisode(self, created)

    async def finish(self, episode_id: str, reward: float | Result) -> None:
        """End an episode with its reward (``POST …/finish``); committed server-side when this returns."""
        await self._episode_request(episode_id, "finish", _finish_body(reward))

    async def abort(
        self, episode_id: str, reason: str = "aborted by client", *, infra_failure: bool = False
    ) -> None:
        """End an episode without a reward (``POST …/abort``; the reason is cut to 4000 characters)."""
        body = EpisodeAbort(reason=reason[:_MAX_REASON_CHARS], infra_failure=infra_failure).model_dump()
        await self._episode_request(episode_id, "abort", body)

    async def heartbeat(self, episode_id: str) -> None:
        """Keep an open episode from being reclaimed (``POST …/heartbeat``)."""
        await self._episode_request(episode_id, "heartbeat")

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
            **_finish_body(reward),
            txn_id=txn_id,
            primary_url=primary_url,
            primary_episode_id=primary_episode_id,
        ).model_dump()
        await self._episode_request(episode_id, "prepare", body)

    async def commit(self, episode_id: str, txn_id: str) -> None:
        """Phase two (``POST …/commit``): the prepared episode becomes finished; idempotent.

        Raises:
            ClientError: 409 when the transaction was aborted on that server.
        """
        await self._episode_request(episode_id, "commit", EpisodeCommit(txn_id=txn_id).model_dump())

    async def get_episode(self, episode_id: str, *, api_key: str | None = None) -> EpisodeView:
        """An episode's state (``GET /api/v1/episodes/{episode_id}``), read with ``api_key`` (the episode's
        key), else the key this client got when it began it, else the client token, else the admin token.

        Raises:
            ClientError: 401 without a credential, 403 with a wrong one, 404 for an unknown episode.
        """
        headers = _bearer(api_key) or self._episode_headers(episode_id) or self._headers
        answer = await self._request("GET", f"/api/v1/episodes/{episode_id}", headers=headers)
        return EpisodeView.model_validate(answer)

    async def status(self) -> StatusView:
        """The server's state, policy version and episode counts (``GET /api/v1/status``)."""
        return StatusView.model_validate(await self._request("GET", "/api/v1/status", admin=True))

    async def metrics(self, since_step: int = 0) -> list[ServerStepMetrics]:
        """Per-step training metrics after policy version ``since_step`` (``GET /api/v1/metrics``),
        oldest first; empty while no step has run or when the server only serves.

        Raises:
            ClientError: the server answered an error (401/403 without the admin token).
            httpx.TransportError: the server could not be reached (after the retries).
        """
        body = await self._request("GET", "/api/v1/metrics", params={"since_step": since_step}, admin=True)
        return _METRICS.validate_python(body)

    async def events(self, since: int = 0, tenant: str | None = None) -> list[Event]:
        """The server's buffered events after sequence number ``since`` (``GET /api/v1/events`` without
        following), oldest first. Pass the last ``seq`` seen to read only new ones; a restarted server
        numbers from 1 again. ``tenant``: only that LoRA tenant's events (`Event.tenant`).

        Raises:
            ClientError: the server answered an error (401/403 without the admin token).
            httpx.TransportError: the server could not be reached (after the retries).
        """
        params: dict[str, Any] = {"since": since, "follow": "false"}
        if tenant is not None:
            params["tenant"] = tenant
        events: list[Event] = await self._request(
            "GET", "/api/v1/events", params=params, admin=True, parse=_events
        )
        return events

    async def config(self) -> ConfigView:
        """The configuration the server's next step will use (``GET /api/v1/config``).

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        return ConfigView.model_validate(await self._request("GET", "/api/v1/config", admin=True))

    async def patch_config(self, /, **changes: Any) -> ConfigChanged:
        """Change live settings (``PATCH /api/v1/config``), e.g. ``quotas={"math": 0.5, "code": 0.5}``;
        they take effect from the next step.

        Args:
            changes: fields of :class:`~swarm.protocol.ConfigPatch`.

        Raises:
            ClientError: 422 for an unknown field, a bad value or an invalid combination; 409 when the
                server does not train.
        """
        body = await self._request("PATCH", "/api/v1/config", changes, admin=True)
        return ConfigChanged.model_validate(body)

    async def checkpoint(self) -> CheckpointSaved:
        """Save a checkpoint now (``POST /api/v1/checkpoint``; waits for a running step to end).

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        return CheckpointSaved.model_validate(await self._request("POST", "/api/v1/checkpoint", admin=True))

    async def create_tenant(self, /, id: str, **settings: Any) -> TenantView:
        """Create a LoRA tenant (``POST /api/v1/tenants``, a server with ``--tenants``): its own adapter,
        optimizer and training settings; settings left out take the server's.

        Args:
            id: Its id (lower-case letters, digits and ``-``, at most 32 characters), positional or
                ``id=`` (the JSON field's name).
            settings: Fields of :class:`~swarm.protocol.TenantCreate` (``lr``, ``batch_size``,
                ``group_size``, ``kl_coef``, ``clip_eps``, ``max_steps``, ``seed``…); ``None`` values are
                left out.

        Raises:
            ValidationError: an invalid id or setting (checked before sending).
            ClientError: 409 when the id is taken, the cap of resident tenants is reached or the server
                hosts no tenants; 422 for settings the server refuses.
        """
        body = TenantCreate(id=id, **settings).model_dump(mode="json", exclude_none=True)
        return TenantView.model_validate(await self._request("POST", "/api/v1/tenants", body, admin=True))

    async def tenants(self) -> list[TenantView]:
        """Every tenant of the server's run dir, resident then retired (``GET /api/v1/tenants``).

        Raises:
            ClientError: 409 on a server without ``--tenants``.
        """
        return _TENANTS.validate_python(await self._request("GET", "/api/v1/tenants", admin=True))

    async def tenant(self, tenant_id: str) -> TenantView:
        """One tenant, resident or retired (``GET /api/v1/tenants/{id}``).

        Raises:
            ClientError: 404 for an unknown tenant.
        """
        return TenantView.model_validate(await self._request("GET", _tenant_path(tenant_id), admin=True))

    async def tenant_metrics(self, tenant_id: str, since_step: int = 0) -> list[ServerStepMetrics]:
        """A tenant's per-step metrics after ``since_step``, oldest first (a retired tenant's too;
        ``GET /api/v1/tenants/{id}/metrics``).

        Raises:
            ClientError: 404 when no tenant has this id.
        """
        path = _tenant_path(tenant_id, "metrics")
        return _METRICS.validate_python(
            await self._request("GET", path, params={"since_step": since_step}, admin=True)
        )

    async def pause_tenant(self, tenant_id: str) -> TenantView:
        """Stop a tenant: no new episode under it, no step until resumed (``POST …/pause``).

        Raises:
            ClientError: 404 when no resident tenant has this id.
        """
        return TenantView.model_validate(
            await self._request("POST", _tenant_path(tenant_id, "pause"), admin=True)
        )

    async def resume_tenant(self, tenant_id: str) -> TenantView:
        """Resume a paused or failed tenant (``POST …/resume``).

        Raises:
            ClientError: 404 when no resident tenant has this id.
        """
        return TenantView.model_validate(
            await self._request("POST", _tenant_path(tenant_id, "resume"), admin=True)
        )

    async def retire_tenant(self, tenant_id: str) -> TenantView:
        """Retire a tenant (``POST …/retire``): its open episodes are aborted, its adapter saved as a LoRA
        checkpoint (``checkpoint`` of the answer) and its place freed.

        Raises:
            ClientError: 404 when no resident tenant has this id.
        """
        return TenantView.model_validate(
            await self._request("POST", _tenant_path(tenant_id, "retire"), admin=True)
        )

    async def client_tokens(self) -> list[ClientTokenView]:
        """The server's client tokens by name, with their open episodes (admin; never the secrets)."""
        return _TOKENS.validate_python(await self._request("GET", "/api/v1/client-tokens", admin=True))

    async def add_client_token(
        self, name: str, token: str | None = None, *, tenants: Sequence[str] | None = None
    ) -> ClientTokenCreated:
        """Add a client token live (admin); ``token=None`` lets the server mint one (the answer has it).
        ``tenants`` limits it to begin episodes under those LoRA tenants only (``None``: no limit); an id
        may name a tenant not created yet.

        Raises:
            ClientError: 409 when the name or the secret is taken, or ``tenants`` on a server without
                ``--tenants``.
            pydantic.ValidationError: Before sending, for a bad name or token, or an empty or repeated
                ``tenants`` (the server's 422s).
        """
        body = ClientTokenCreate(
            name=name, token=token, tenants=None if tenants is None else list(tenants)
        ).model_dump(exclude_none=True)
        answer = await self._request("POST", "/api/v1/client-tokens", body, admin=True)
        return ClientTokenCreated.model_validate(answer)

    async def revoke_client_token(self, name: str) -> ClientTokenRevoked:
        """Revoke a client token live (admin).

        Raises:
            ClientError: 404 when no token has this name.
        """
        answer = await self._request("DELETE", f"/api/v1/client-tokens/{name}", admin=True)
        return ClientTokenRevoked.model_validate(answer)

    async def vote_ready(self, ready: bool = True) -> VoteCast:
        """Vote that this client's round is done (``POST /api/v1/clients/{client_id}/ready``), for the
        ``all_clients_ready`` / ``any_client_ready`` batch policies; ``ready=False`` withdraws the vote.
        Votes are cleared by the step they produce. No admin token needed.

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        body = Vote(ready=ready).model_dump()
        answer = await self._request("POST", self._client_path("ready"), body, headers=self._begin_headers)
        return VoteCast.model_validate(answer)

    async def client_heartbeat(self) -> ClientState:
        """Keep this client active for the voting policies while it has no episode open
        (``POST /api/v1/clients/{client_id}/heartbeat``).

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        answer = await self._request("POST", self._client_path("heartbeat"), headers=self._begin_headers)
        return ClientState.model_validate(answer)

    async def leave(self) -> ClientState:
        """Say goodbye (``DELETE /api/v1/clients/{client_id}``): this client and its vote stop counting for
        the voting policies; its finished episodes are still trained.

        Raises:
            ClientError: 409 when the server does not train (inference mode).
        """
        answer = await self._request("DELETE", self._client_path(), headers=self._begin_headers)
        return ClientState.model_validate(answer)

    @contextlib.asynccontextmanager
    async def episode(self, task_id: str, **kwargs: Any) -> AsyncIterator[AsyncEpisode]:
        """Open an episode for the block (arguments of :meth:`begin`); an exception inside aborts it (and
        is re-raised).

        The abort is an infrastructure failure (``infra_failure=true``) when the exception is one (see
        :func:`swarm.client.classify_failure`) or the block was cancelled/interrupted.

        Leaving the block without ``ep.finish(...)`` aborts the episode too: an episode never stays open.
        """
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
