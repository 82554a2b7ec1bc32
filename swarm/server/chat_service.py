"""What the chat routes of both wire formats do: check, render, sample and record one chat call of an open
episode (`ChatService`), and the request's sampling rules: `max_tokens_for` (every server rule of
``max_tokens``) and `sampling_for`. The pure parts, `PreparedCall`, `ChatResult` and the call record, are
`swarm.server.chat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from swarm.config import SamplingDefaults
from swarm.engine.base import Engine, SamplingParams, TokenCallback
from swarm.errors import ContextLengthError, RequestError, Unavailable
from swarm.protocol import ChatCompletionRequest
from swarm.server.chat import ChatResult, PreparedCall, agent_for, record_call
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.episodes import OpenEpisode, OpenEpisodes
from swarm.server.limits import ClientLimits, check_chat_request
from swarm.server.stopping import STOP_CANCEL, STOPPED_MESSAGE, Stopping
from swarm.tracking.records import CallRecord
from swarm.tracking.render import PromptRenderer

T = TypeVar("T")


def max_tokens_for(
    request: ChatCompletionRequest, default: int, cap: int | None, max_context: int | None = None
) -> int:
    """Every server rule of a chat call's ``max_tokens``, in one place (both wire formats: an Anthropic
    request's ``max_tokens`` arrives as the chat request's, `anthropic_format.to_chat_request`). The
    engine clips the result to the context window (`swarm.engine.limits.max_new_tokens`).

    Args:
        request: the chat request (``max_completion_tokens`` wins over ``max_tokens``).
        default: the server's default (`SamplingDefaults.max_tokens`), for a request that names neither.
        cap: ``Limits.max_tokens`` (``None``: no cap); a default above it is lowered to it.
        max_context: the model's context window in tokens (`Engine.max_context`; ``None``: not checked).
            A field asking for more than the whole window is refused, as vLLM's OpenAI server refuses it;
            one that fits the window but not beside the prompt is clipped by the engine (``finish_reason``
            ``length``), which vLLM would refuse too.

    Returns:
        The number of completion tokens to sample at most (>= 1).

    Raises:
        RequestError: ``max_tokens`` or ``max_completion_tokens`` above ``cap`` (422 naming the field).
        ContextLengthError: either field above ``max_context`` (400 naming the field and the window).
    """
    for field in ("max_tokens", "max_completion_tokens"):
        asked = getattr(request, field)
        if asked is None:
            continue
        if cap is not None and asked > cap:
            raise RequestError(
                f"{field}: {asked} is above this server's cap of {cap}", status_code=422, param=field
            )
        if max_context is not None and asked > max_context:
            raise ContextLengthError(
                f"{field}: {asked} is more than this model's maximum context length of {max_context} "
                "tokens (prompt and completion together)",
                param=field,
            )
    if cap is None:
        return request.max_completion_tokens or request.max_tokens or default
    return request.max_completion_tokens or request.max_tokens or min(default, cap)


def sampling_for(
    request: ChatCompletionRequest, defaults: SamplingDefaults, max_tokens: int
) -> SamplingParams:
    """The request's sampling parameters, the server's defaults where it leaves them out.

    Args:
        max_tokens: what `max_tokens_for` ruled for this request.

    Raises:
        RequestError: ``top_logprobs`` without ``logprobs=true`` (400).
    """
    top_k = request.top_logprobs or 0
    if top_k and not request.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    return SamplingParams(
        temperature=defaults.temperature if request.temperature is None else request.temperature,
        top_p=defaults.top_p if request.top_p is None else request.top_p,
        max_tokens=max_tokens,
        stop=tuple(request.stop or ()),  # the validator turned a string into a list
        seed=request.seed,
        n=request.n,
        top_logprobs=top_k,
    )


class ChatService:
    """The chat calls of open episodes (both wire formats): checked, rendered, sampled and recorded.

    What the chat routes depend on (`swarm.server.deps.ChatDep`); the episode's own state is written by
    `OpenEpisodes` (`sample`, `record`), the limits are `ClientLimits`'.

    Args:
        engine: samples token ids (``check_prompt``, ``generate``; ``stop_ids`` for streamed answers).
        episodes: the open-episode table.
        limits: the limits in force and the request rates.
        defaults: the server's sampling defaults.
        policy_version: the policy version being served (completed trainer steps).
    """

    def __init__(
        self,
        engine: Engine,
        episodes: OpenEpisodes,
        limits: ClientLimits,
        defaults: SamplingDefaults,
        policy_version: Callable[[], int],
    ) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.renderer = PromptRenderer(engine.tokenizer)
        self.detokenizer = TokenizerDetokenizer(engine.tokenizer)
        self.episodes = episodes
        self.limits = limits
        self.defaults = defaults
        self.policy_version = policy_version
        self._tasks: set[asyncio.Task[Any]] = set()

    def _admit(self, episode: OpenEpisode, request: ChatCompletionRequest) -> int:
        """Check a chat call before anything is rendered: the request caps (`check_chat_request`), its
        ``max_tokens`` (`max_tokens_for`), then the owner's request rate (`ClientLimits.take`).

        Returns:
            The ``max_tokens`` the call samples with.

        Raises:
            RequestError: a field over its cap (422), or over the context window (400).
            Unavailable: the owner's client token is over its request rate (429 + Retry-After).
        """
        limits = self.limits.limits
        check_chat_request(limits, request)
        max_tokens = max_tokens_for(
            request, self.defaults.max_tokens, limits.max_tokens, self.engine.max_context
        )
        self.limits.take(episode.owner)
        return max_tokens

    def count_prompt_tokens(self, episode: OpenEpisode, request: ChatCompletionRequest) -> int:
        """The prompt length ``request`` would have as the episode's next call: rendered and spliced as
        `prepare` does, under the same caps and request rate; nothing is sampled or recorded.

        Raises:
            RequestError: unknown model, unrenderable messages (400/404) or a field over its cap (422).
            Unavailable: the owner's client token is over its request rate (429 + Retry-After).
        """
        self._admit(episode, request)
        agent = agent_for(request, self.model_name)
        rendered = self.renderer.render(request.messages, request.tools, history=episode.calls, agent=agent)
        return len(rendered.prompt_ids)

    def prepare(self, episode: OpenEpisode, request: ChatCompletionRequest) -> PreparedCall:
        """Check and render one chat request of an open episode (nothing sampled or recorded yet).

        Raises:
            RequestError: unknown model, unrenderable messages, or a prompt that does not fit (400/404);
                a field over its cap (422).
            Unavailable: the owner's client token is over its request rate (429 + Retry-After).
        """
        arrived = time.time()
        max_tokens = self._admit(episode, request)
        agent = agent_for(request, self.model_name)
        params = sampling_for(request, self.defaults, max_tokens)
        if episode.request.tenant is not None:  # every call of a tenant's episode samples its adapter
            params = dataclasses.replace(params, adapter=episode.request.tenant)
        rendered = self.renderer.render(request.messages, request.tools, history=episode.calls, agent=agent)
        self.engine.check_prompt(rendered.prompt_ids)
        parse_tools = bool(request.tools) and request.tool_choice != "none"
        return PreparedCall(
            arrived=arrived, agent=agent, params=params, rendered=rendered, parse_tools=parse_tools
        )

    async def answer(
        self,
        episode: OpenEpisode,
        request: ChatCompletionRequest,
        *,
        prepared: PreparedCall | None = None,
        on_token: TokenCallback | None = None,
    ) -> ChatResult:
        """Render, sample and record one chat request of an open episode.

        Args:
            prepared: `prepare`'s result, when the caller checked the request before (a streaming
                response must fail with an HTTP error before its first byte).
            on_token: sees every token as it is sampled, on the engine's thread (`Engine.generate`).

        Returns:
            The call records (one per choice, appended to the episode) and the engine's completions.

        Raises:
            RequestError: unknown model, unrenderable messages, or a prompt that does not fit (400/404).
            EpisodeStateError: the episode ended while the call was sampled (nothing is recorded).
            asyncio.CancelledError: the caller was cancelled before the answer was complete: the engine
                request is aborted and nothing is recorded; a ``call.abandoned`` event is logged unless
                the server's stop cancelled it (`swarm.server.stopping.STOP_CANCEL`).
        """
        if prepared is None:
            prepared = self.prepare(episode, request)
        prompt_ids = prepared.rendered.prompt_ids
        queued = time.time()
        handed = time.perf_counter()
        generation = self.engine.generate(prompt_ids, prepared.params, on_token)
        try:
            completions = await self.episodes.sample(episode, prepared.arrived, generation)
        except asyncio.CancelledError as cancelled:  # the caller stopped waiting
            if STOP_CANCEL not in cancelled.args:  # its client went away (the stop logs its own event)
                self._abandoned(episode, prepared, time.perf_counter() - handed)
            raise
        engine_s = time.perf_counter() - handed
        trainable = episode.is_trainable(prepared.agent)

        def build(first: int) -> list[CallRecord]:
            return [
                record_call(
                    prepared,
                    completion,
                    index=first + i,
                    trainable=trainable,
                    salt=f"{episode.id}:{first + i}",
                    queued=queued,
                )
                for i, completion in enumerate(completions)
            ]

        records = self.episodes.record(episode, build)
        return ChatResult(
            records=records,
            completions=completions,
            prompt_tokens=len(prompt_ids),
            agent=prepared.agent,
            policy_version=(
                self.policy_version() if prepared.params.adapter is None else completions[0].policy_version
            ),
            created_at=time.time(),
            arrived=prepared.arrived,
            engine_s=engine_s,
        )

    async def answer_while_connected(
        self,
        episode: OpenEpisode,
        request: ChatCompletionRequest,
        gone: Coroutine[Any, Any, None],
        stopping: Stopping | None = None,
    ) -> ChatResult | None:
        """`answer`, given up as soon as the client has gone: a non-streamed call whose client timed out,
        was interrupted or retried (docs/ARCHITECTURE.md §One request's path); or as soon as the server
        stops (``stopping``), as a live stream is (`swarm.server.stopping`).

        Args:
            gone: returns once the client has disconnected (`swarm.server.disconnect.client_gone`).
            stopping: the server's stop; ``None``: the call runs until it ends or its client goes.

        Returns:
            The answer, or ``None`` when the client went away first: the engine request was aborted (its
            rows freed at the next decode step, or before its batch began), nothing was recorded and a
            ``call.abandoned`` event was logged.

        Raises:
            Unavailable: the server began to stop before the answer was complete (503, `STOPPED_MESSAGE`):
                the engine request was aborted and nothing was recorded (``server.stopping`` says why).
            What `answer` raises.
        """
        call = asyncio.ensure_future(self.answer(episode, request))
        watcher = asyncio.ensure_future(gone)

        def stop() -> None:
            call.cancel(STOP_CANCEL)  # `answer` logs no call.abandoned for it: server.stopping says why

        unwatch = None if stopping is None else stopping.on_stop(stop)
        try:
            await asyncio.wait((call, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if unwatch is not None:
                unwatch()
            watcher.cancel()
            if not call.done():  # the client went away (or this handler was cancelled)
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
        if call.cancelled():
            if stopping is not None and stopping.is_set() and not watcher.done():
                raise Unavailable(STOPPED_MESSAGE, retry_after_s=5.0)
            return None
        return call.result()  # complete before the disconnect was seen: recorded and answered

    def _abandoned(self, episode: OpenEpisode, prepared: PreparedCall, waited_s: float) -> None:
        """Log a call given up before its answer was complete (nothing of it is recorded)."""
        self.episodes.events.emit(
            "call.abandoned",
            f"a call of episode {episode.id} was given up after {waited_s:.2f} s: its client went away "
            "before the answer was complete; nothing was recorded",
            episode_id=episode.id,
            agent=prepared.agent,
            max_tokens=prepared.params.max_tokens,
            waited_s=round(waited_s, 3),
        )

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task held until it ends (e.g. a streamed call's recording, which must finish
        even when its client has gone)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Its outcome may have no reader left (a client that went away): retrieve it, so asyncio does
        # not report an exception nobody retrieved.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task
