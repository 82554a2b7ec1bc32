"""The server's stop, announced to the responses that would otherwise outlive it.

uvicorn stops in this order: it closes its listeners, waits for every open connection to finish its
response, then runs the app's lifespan shutdown. A response that never finishes by itself (a follower of
``GET /api/v1/events``, which streams until the client leaves) therefore held a SIGTERMed server forever,
with its model, pool and run dir. `Stopping` is set the moment the stop begins, before uvicorn waits
(`swarm.server.shutdown.Server`), and the long-lived responses watch it:

- the event stream sends what is queued for it and ends (`swarm.server.control_routes.events`);
- a live chat stream (``stream=true`` on ``/v1/chat/completions`` and ``/v1/messages``) cancels its call,
  as when its client leaves, and ends with its protocol's error event (`swarm.server.streaming.live_call`);
- a non-streamed chat call cancels its call the same way and answers 503 in its API's error shape
  (`swarm.server.chat_service.ChatService.answer_while_connected`).

The app's lifespan shutdown sets it too (a server run without ``swarm serve``'s `Server`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

STOP_CANCEL = "swarm: the server is stopping"
"""The message a call cancelled by the stop is cancelled with (``Task.cancel(msg)``): `ChatService.answer`
tells it from a client that went away (``server.stopping`` already says why; no ``call.abandoned``)."""


STOPPED_MESSAGE = "the server is stopping: the call was cancelled before its end and not recorded"
"""The 503 a call the stop cancelled answers with: a live stream's error event, a non-streamed call's body."""


class Stopping:
    """A one-way flag: the server is stopping. Created with the app, set once, never cleared; used on the
    event loop only."""

    def __init__(self) -> None:
        self._event = asyncio.Event()  # bound to the running loop at its first wait (Python >= 3.10)
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    def set(self) -> None:
        """Announce the stop: run every registered callback (once) and wake every waiter."""
        if self._event.is_set():
            return
        self._event.set()
        callbacks, self._callbacks = list(self._callbacks.values()), {}
        for callback in callbacks:
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        """Return once the server is stopping."""
        await self._event.wait()

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the stop is announced (at once when it already was); returns the
        function that unregisters it (call it when the response ends first)."""
        if self._event.is_set():
            callback()
            return lambda: None
        key = next(self._ids)
        self._callbacks[key] = callback

        def unregister() -> None:
            self._callbacks.pop(key, None)

        return unregister
