"""uvicorn's httptools protocol with each response's head and body sent in one socket write, JSON answers
to the requests uvicorn refuses before the app, and a bound on the time to receive a request.

Errors before the app: a request line or header httptools cannot parse (a non-numeric or conflicting
``Content-Length``, a bad header name) got uvicorn's plain-text "400 Invalid HTTP request received"; here it
is a JSON :class:`~swarm.protocol.ErrorBody` like every other error, and a method httptools does not know
(``FOO /``) is a 501 (RFC 9110 section 15.6.2) in the same shape. A request not received whole within
``request_timeout_s`` (headers that never end, a ``Content-Length`` longer than the body sent, a body
trickled byte by byte) is answered 408 in the same shape and its connection closed, and so is a connection
that sends nothing for that long; uvicorn would wait forever (its keep-alive timeout only runs between
requests). The app then sees the client gone (``http.disconnect``) and its answer is dropped.

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
import re
import sys
from typing import Any

from swarm.protocol import ErrorBody, ErrorDetail
from swarm.server.framework import PROTOCOL, fast_path

REQUEST_TIMEOUT_S = 60.0
"""Longest time a request may take to arrive whole, from its first byte (or the connection's start) to its
last (seconds); the largest body the server takes (``max_body_bytes``) needs far less on any working link."""

_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [^ \r\n]+ HTTP/\d\.\d\r?\n")
"""A request line as RFC 9112 §3 writes it: a method token, a target and the version."""
_REQUEST_LINE_MAX = 8192
"""Bytes of a request's first data kept to tell an unknown method from a malformed request."""
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
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools missing: uvicorn chooses its own (h11)
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

if HttpToolsProtocol is not None:

    class SwarmHttpProtocol(HttpToolsProtocol):
        """uvicorn's ``HttpToolsProtocol`` writing each response's head and body at once, answering what it
        refuses before the app in JSON, and timing out requests that do not arrive (module docstring)."""

        request_timeout_s: float = REQUEST_TIMEOUT_S
        """See `REQUEST_TIMEOUT_S` (a subclass may set another)."""

        _request_timer: asyncio.TimerHandle | None = None
        _receiving = False  # a request has begun and not yet been received whole
        _first_bytes = b""  # the start of the data that began the current request (its request line)
        _headers_done = False  # ... and its headers were complete (``self.cycle`` is its own)

        def data_received(self, data: bytes) -> None:
            if not self._receiving:  # this data begins a request (unless a pipelined one follows another)
                self._first_bytes = bytes(data[:_REQUEST_LINE_MAX])
            super().data_received(data)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.transport = _CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
            self._arm_request_timer()  # a connection that sends nothing is closed too

        # -- errors before the app, in JSON ---------------------------------------------------------------
        def send_400_response(self, msg: str) -> None:
            self._cancel_request_timer()
            # uvicorn calls this inside its ``except HttpParserError``: a well-formed request line whose
            # method httptools does not know is a 501 (RFC 9110 section 15.6.2), not a malformed request
            unknown = isinstance(sys.exc_info()[1], httptools.HttpParserInvalidMethodError)
            if unknown and _REQUEST_LINE.match(self._first_bytes):
                message = (
                    "unknown HTTP method: the request line names a method this server does not implement "
                    "(a path answers a standard method it does not serve with 405 and Allow)"
                )
                self._answer_and_close(501, "not_implemented", message)
                return
            message = (  # uvicorn's ``msg`` is always "Invalid HTTP request received."
                "invalid HTTP request: the request line or a header cannot be parsed (e.g. a non-numeric or "
                "repeated Content-Length, or a header name with a space)"
            )
            self._answer_and_close(400, "invalid_request_error", message)

        def _answer_and_close(self, status: int, kind: str, message: str) -> None:
            body = ErrorBody(error=ErrorDetail(type=kind, message=message)).model_dump_json(exclude_none=True)
            head = [_STATUS_LINES[status]]
            for name, value in self.server_state.default_headers:
                head.extend([name, b": ", value, b"\r\n"])
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
            head.append(b"connection: close\r\n\r\n")
            self.transport.write(b"".join(head) + body.encode())
            self.transport.close()

        # -- the request timeout ----------------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._receiving, self._headers_done = True, False
            self._arm_request_timer()

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._headers_done = True

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._receiving = False
            self._cancel_request_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_request_timer()
            super().connection_lost(exc)

        def _arm_request_timer(self) -> None:
            self._cancel_request_timer()
            self._request_timer = self.loop.call_later(self.request_timeout_s, self._request_timed_out)

        def _cancel_request_timer(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def _request_timed_out(self) -> None:
            self._request_timer = None
            if self.transport.is_closing():
                return
            cycle = self.cycle if self._headers_done else None
            if cycle is not None:  # the app waits for the rest of the body: it sees the client gone
                cycle.disconnected = True
                cycle.message_event.set()
            if self._receiving and (cycle is None or not cycle.response_started):
                message = f"the request did not arrive whole within {self.request_timeout_s:g} s"
                self._answer_and_close(
                    408, "request_timeout", message + " (a body shorter than its Content-Length?)"
                )
            else:  # nothing was sent, or the app has answered already
                self.transport.close()

    _STATUS_LINES = {
        400: b"HTTP/1.1 400 Bad Request\r\n",
        408: b"HTTP/1.1 408 Request Timeout\r\n",
        501: b"HTTP/1.1 501 Not Implemented\r\n",
    }


def http_protocol() -> type[asyncio.Protocol] | str:
    """The ``http`` argument for ``uvicorn.run``/``uvicorn.Config``: the coalescing httptools protocol,
    or ``"auto"`` where uvicorn's httptools implementation is not available or uvicorn is outside its
    tested versions (`swarm.server.framework`)."""
    if HttpToolsProtocol is None or not fast_path(PROTOCOL, "coalescing HTTP protocol"):
        return "auto"
    return SwarmHttpProtocol
