"""``SwarmClient`` / ``Episode``: the blocking face of :class:`~swarm.client.AsyncSwarmClient`.

There is one client implementation, the async one; every blocking method runs the same coroutine on a
private event loop that lives on a daemon thread of its own (:class:`_PrivateLoop`). Chosen over the
alternatives because it holds wherever a blocking client gets called from:

- **threads**: any number of threads may call one client at once; their coroutines are handed to the one
  loop (``asyncio.run_coroutine_threadsafe``), which alone uses the client's connection pool.
- **a running event loop** (Jupyter, an async framework calling blocking code): ``asyncio.run`` per call
  refuses to start there and ``run_until_complete`` on the caller's loop would deadlock; here the caller
  only waits for a future (its own loop is blocked for the call, as by any blocking client).
- **fork**: a forked child has the loop object but not its thread, and the parent's sockets are not its
  to use: at its first call in a new process the client opens a fresh connection pool on a fresh loop.
- **Ctrl-C** while a call waits: the request is cancelled on the loop and ``KeyboardInterrupt`` propagates.

The alternative, a transport-agnostic request builder with two httpx faces, keeps two copies of every
method, of the retry loop and of the episode block's abort rule; a thread hop costs tens of microseconds
next to a request's milliseconds. The loop's thread starts at the first call and stops on ``close()``
(or when the client is garbage-collected, or at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from swarm.client._client import AsyncEpisode, AsyncSwarmClient, ClientOptions, Timeouts
from swarm.client.workflow import Result

P = ParamSpec("P")
T = TypeVar("T")


class _PrivateLoop:
    """An asyncio event loop on a daemon thread, started at the first :meth:`run` in each process.

    Args:
        name: the thread's name.
        on_new_process: called (under the loop's lock) before the loop is started in a forked child.
    """

    def __init__(self, name: str, on_new_process: Callable[[], None]) -> None:
        self._name = name
        self._on_new_process = on_new_process
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception).

        Raises:
            RuntimeError: called from a coroutine running on this loop (it would wait for itself).
        """
        loop = self._started()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking swarm client was called from its own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        finally:
            future.cancel()  # nothing once done; interrupted (Ctrl-C): the request stops too

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the loop's thread did not come along
                self._pid, self._loop, self._thread = os.getpid(), None, None
                self._on_new_process()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        """Stop the loop (tasks still running are cancelled) and wait for its thread; idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop thread: run until stopped, then cancel what is left and close (as ``asyncio.run``)."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _blocking(
    method: Callable[Concatenate[AsyncSwarmClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SwarmClient, P], T]:
    """The blocking method of :class:`SwarmClient` that runs ``method`` of its async client (same
    arguments, docstring and errors)."""

    def call(self: SwarmClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self._core, *args, **kwargs))

    return _named_after(method, call)


def _opens_episode(
    method: Callable[Concatenate[AsyncSwarmClient, P], Coroutine[Any, Any, AsyncEpisode]],
) -> Callable[Concatenate[SwarmClient, P], Episode]:
    """:func:`_blocking` for a method that opens an episode: the answer is the blocking :class:`Episode`."""
    opened = _blocking(method)

    def call(self: SwarmClient, /, *args: P.args, **kwargs: P.kwargs) -> Episode:
        return Episode(self, opened(self, *args, **kwargs))

    return _named_after(method, call)


def _named_after(method: Callable[..., Any], call: Callable[P, T]) -> Callable[P, T]:
    """``call`` with ``method``'s name, docstring and signature (``help``), as a :class:`SwarmClient`
    method."""
    functools.update_wrapper(call, method)
    call.__qualname__ = f"SwarmClient.{method.__name__}"
    return call


class Episode:
    """An open episode (blocking face of :class:`~swarm.client.AsyncEpisode`): ``id``, ``base_url``,
    ``api_key``, ``model``, and ``llm``, what an OpenAI-compatible agent needs."""

    def __init__(self, client: SwarmClient, episode: AsyncEpisode) -> None:
        self._client = client
        self._episode = episode
        self.id = episode.id
        self.base_url = episode.base_url
        self.api_key = episode.api_key
        self.model = episode.model
        self.llm = episode.llm

    @property
    def ended(self) -> bool:
        """Whether this client has finished or aborted the episode."""
        return self._episode.ended

    @ended.setter
    def ended(self, value: bool) -> None:
        self._episode.ended = value

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.base_url!r}, ended={self.ended})"

    def finish(self, reward: float | Result) -> None:
        """End with a reward (or a :class:`Result`); committed server-side when this returns."""
        self._client._run(self._episode.finish(reward))

    def abort(self, reason: str = "aborted by client", *, infra_failure: bool = False) -> None:
        """End without a reward (``infra_failure``: not the agent's fault, kept out of its group)."""
        self._client._run(self._episode.abort(reason, infra_failure=infra_failure))

    def heartbeat(self) -> None:
        """Keep the episode from being reclaimed by the server's episode timeout."""
        self._client._run(self._episode.heartbeat())


class SwarmClient:
    """Blocking client of one swarm server: :class:`~swarm.client.AsyncSwarmClient`'s methods, arguments,
    timeouts, retries and errors, each call waiting for its answer (see the module docstring).

    Args:
        url: server root, e.g. ``http://127.0.0.1:8000``.
        options: :class:`~swarm.client.AsyncSwarmClient`'s keyword options (tokens, ``client_id``,
            ``timeout_s``, ``retry``); ``transport`` is an httpx *async* transport
            (``httpx.MockTransport`` is both).
    """

    def __init__(self, url: str, **options: Unpack[ClientOptions]) -> None:
        self._core = AsyncSwarmClient(url, **options)
        self._loop = _PrivateLoop(f"swarm-client {self._core.url}", self._core._reconnect)
        self._stop_loop = weakref.finalize(self, self._loop.close)
        self.url, self.client_id, self.retry = self._core.url, self._core.client_id, self._core.retry
        self.timeouts: Timeouts = self._core.timeouts

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def close(self) -> None:
        """Close the connections and stop the private loop."""
        try:
            self._run(self._core.aclose())
        finally:
            self._stop_loop()

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    begin = _opens_episode(AsyncSwarmClient.begin)
    finish = _blocking(AsyncSwarmClient.finish)
    abort = _blocking(AsyncSwarmClient.abort)
    heartbeat = _blocking(AsyncSwarmClient.heartbeat)
    prepare = _blocking(AsyncSwarmClient.prepare)
    commit = _blocking(AsyncSwarmClient.commit)
    get_episode = _blocking(AsyncSwarmClient.get_episode)
    status = _blocking(AsyncSwarmClient.status)
    metrics = _blocking(AsyncSwarmClient.metrics)
    events = _blocking(AsyncSwarmClient.events)
    config = _blocking(AsyncSwarmClient.config)
    patch_config = _blocking(AsyncSwarmClient.patch_config)
    checkpoint = _blocking(AsyncSwarmClient.checkpoint)
    create_tenant = _blocking(AsyncSwarmClient.create_tenant)
    tenants = _blocking(AsyncSwarmClient.tenants)
    tenant = _blocking(AsyncSwarmClient.tenant)
    tenant_metrics = _blocking(AsyncSwarmClient.tenant_metrics)
    pause_tenant = _blocking(AsyncSwarmClient.pause_tenant)
    resume_tenant = _blocking(AsyncSwarmClient.resume_tenant)
    retire_tenant = _blocking(AsyncSwarmClient.retire_tenant)
    client_tokens = _blocking(AsyncSwarmClient.client_tokens)
    add_client_token = _blocking(AsyncSwarmClient.add_client_token)
    revoke_client_token = _blocking(AsyncSwarmClient.revoke_client_token)
    vote_ready = _blocking(AsyncSwarmClient.vote_ready)
    client_heartbeat = _blocking(AsyncSwarmClient.client_heartbeat)
    leave = _blocking(AsyncSwarmClient.leave)

    @contextlib.contextmanager
    def episode(self, task_id: str, **kwargs: Any) -> Iterator[Episode]:
        """:meth:`AsyncSwarmClient.episode`, blocking: the same block (run on the private loop), so an
        exception inside aborts the episode (an infrastructure failure when it is one) and leaving
        without ``ep.finish(...)`` aborts it too."""
        block = self._core.episode(task_id, **kwargs)
        ep = Episode(self, self._run(block.__aenter__()))
        try:
            yield ep
        except BaseException as exc:
            self._run(block.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        self._run(block.__aexit__(None, None, None))
