"""uvicorn's httptools protocol with each response's head and body sent in one socket write.

Why: uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start`` and the body at ``http.response.body``: two ``send`` system calls (and two TCP
segments) per response. On loopback a send also runs the receiving side's TCP processing, and the two
writes were the largest single share of the event loop's CPU per request left after the lean hot routes
(``bench/server_cpu.py --profile``). Here a connection's transport holds a response head back until the
next write on that connection (the body, or the first chunk of a stream) and sends both at once; a head
with nothing after it in the same turn of the event loop (a response without a body, the 100-continue
interim response) is sent at the end of that turn. The bytes on the wire and their order are unchanged.

This touches uvicorn internals (``HttpToolsProtocol.connection_made`` keeping the transport it is given in
``self.transport``, and ``RequestResponseCycle`` writing the head alone), tested on the uvicorn versions
of `swarm.server.framework.TESTED`; :func:`http_protocol` falls back to uvicorn's ``"auto"`` when
httptools' protocol cannot be imported or uvicorn is outside that range (with one log line).
"""

from __future__ import annotations

import asyncio
from typing import Any

from swarm.server.framework import PROTOCOL, fast_path

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"


class _CoalescingTransport:
    """A transport that sends a response head (uvicorn writes it alone) together with the next write."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif isinstance(data, bytes) and data.startswith(_HEAD_START) and data.endswith(_HEAD_END):
            self._held = data
            self._loop.call_soon(self._flush)  # a head nothing follows in this turn goes out at its end
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # every other transport method: the real transport's
        return getattr(self._transport, name)


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools missing: uvicorn chooses its own (h11)
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

if HttpToolsProtocol is not None:

    class SwarmHttpProtocol(HttpToolsProtocol):
        """uvicorn's ``HttpToolsProtocol`` writing each response's head and body at once."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.transport = _CoalescingTransport(transport, self.loop)  # type: ignore[assignment]


def http_protocol() -> type[asyncio.Protocol] | str:
    """The ``http`` argument for ``uvicorn.run``/``uvicorn.Config``: the coalescing httptools protocol,
    or ``"auto"`` where uvicorn's httptools implementation is not available or uvicorn is outside its
    tested versions (`swarm.server.framework`)."""
    if HttpToolsProtocol is None or not fast_path(PROTOCOL, "coalescing HTTP protocol"):
        return "auto"
    return SwarmHttpProtocol
