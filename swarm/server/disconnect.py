"""Noticing that an HTTP client has gone while its request is still being served.

A non-streamed chat call is answered only once it is sampled; a client that times out, is interrupted or
retries meanwhile has closed its connection. The ASGI server then answers ``receive()`` with
``http.disconnect`` (uvicorn: once the connection is lost; a request's body has been read whole before the
route runs, so nothing else arrives). `client_gone` waits for that message, as Starlette's
``StreamingResponse`` does for a streamed answer (whose client going away closes the stream,
`swarm.server.streaming.live_call`). `swarm.server.chat_service.ChatService.answer_while_connected` races
it against the call and aborts the call when it comes first.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["client_gone", "gone_answer"]


async def client_gone(request: Request) -> None:
    """Return once the client of ``request`` has disconnected (``http.disconnect``); never for a client
    that stays.

    Call it only after the request's body has been read whole (FastAPI has, before a route with a body
    runs): it reads the request's ASGI ``receive`` and drops anything but the disconnect.
    """
    while (await request.receive())["type"] != "http.disconnect":
        pass


def gone_answer() -> Response:
    """What a route returns for a client that has gone: 499 (nginx's "client closed request"), which
    nobody receives; uvicorn drops a response to a closed connection and logs nothing for it."""
    return Response(status_code=499)
