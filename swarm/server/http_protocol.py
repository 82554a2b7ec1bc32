"""uvicorn's httptools protocol with each response's head and body sent in one socket write, JSON answers
to the requests uvicorn refuses before the app, and a bound on the time to receive a request.

Errors before the app: a request line or header httptools cannot parse (a non-numeric or conflicting
``Content-Length``, a bad header name) got uvicorn's plain-text "400 Invalid HTTP request received"; here it
is a JSON :class:`~swarm.protocol.ErrorBody` like every other error, and a method httptools does not know
(``FOO /``) is a 501 (RFC 9110 section 15.6.2) in the same shape. A request not received whole within
``request_timeout_s`` (headers that never end, a ``Content-Length`` longer than the body sent, a body
trickled byte by byte) is answered 408 in the same shape and its connection closed, and so is a connection
that sends nothing for that long; uvicorn would wait forever (its keep-alive timeout only runs between
requests). The app then sees the client gone (``http.disconnect``) and its answer is dropped. A request
whose head (request line and headers) grows past ``max_header_bytes`` is answered 431 (RFC 6585 section 5)
in the same shape and its connection closed before the app sees it; httptools itself sets no bound, so a
client could make the server hold headers of any size. When the server's stop begins, a request whose body
is still arriving is answered 503 ("the server is stopping") in the same shape and its connection closed,
so a slow client cannot hold the stop for uvicorn's graceful-shutdown bound. A request begun when the client
shuts its sending side (a body shorter than its ``Content-Length``, headers cut short) can never arrive
whole: it is answered 400 in the same shape at once (uvicorn closed without a word).

Pipelined requests (RFC 9112 section 9.3.2): where one of these refusals falls on a request behind others
in the same connection that are still to be answered, it waits for their answers and goes out after them,
with the status the refused request gets alone; the refused request never reaches the app. uvicorn closed
at once: the client lost those answers (and the requests ran all the same), each app writing its answer to
the closed connection logged a traceback (uvloop raises on such a write), and the request line of the
request ahead made any junk behind it look like an unknown method (501).

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
import contextlib
import re
import sys
from typing import Any

from swarm.protocol import ErrorBody, ErrorDetail
from swarm.server.framework import PROTOCOL, fast_path

REQUEST_TIMEOUT_S = 60.0
"""Longest time a request may take to arrive whole, from its first byte (or the connection's start) to its
last (seconds); the largest body the server takes (``max_body_bytes``) needs far less on any working link."""

MAX_HEADER_BYTES = 64 * 1024
"""Default bound on a request's head: its target plus every header line (bytes; ``swarm serve
--max-header-bytes``). nginx answers heads over 32 KiB (4 × 8 KiB buffers) with an error, Node over 16 KiB."""

LINGER_S = 2.0
"""After a 431, how long the server reads and drops what the client still sends before it closes."""

STOPPED_BODY_MESSAGE = (
    "the server is stopping: the request's body was still arriving and the request was not served"
)
"""The 503 a request whose body is still arriving when the stop begins is answered with (`SwarmHttpProtocol`)."""

_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [^ \r\n]+ HTTP/\d\.\d\r?\n")
"""A request line as RFC 9112 §3 writes it: a method token, a target and the version."""
_REQUEST_LINE_MAX = 8192
"""Bytes of a request's first data kept to tell an unknown method from a malformed request."""
_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"


class _CoalescingTransport:
    """A transport that sends a response head (uvicorn writes it alone) together with the next write."""

    __slots__ = ("_held", "_loop", "_shut", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._shut = False  # closed, aborted or its sending side shut here

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._shut or self._transport.is_closing():
            # An answer to a connection the server has closed (after refusing a request pipelined behind
            # this one, or at a timeout) before uvicorn has seen it lost: it cannot be delivered. uvloop
            # raises on such a write (asyncio after ``write_eof``), and the app would log a traceback.
            self._held = None
            return
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
        self._shut = True
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._shut = True
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._shut = True
        self._transport.write_eof()

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
        max_header_bytes: int = MAX_HEADER_BYTES
        """See `MAX_HEADER_BYTES` (:func:`http_protocol` makes a subclass with another)."""

        _request_timer: asyncio.TimerHandle | None = None
        _receiving = False  # a request has begun and not yet been received whole
        _headers_done = False  # ... and its headers were complete (``self.cycle`` is its own)
        _first_bytes = b""  # the start of the data that began the current request (its request line), or
        # b"" where it began after another request in the same data (`_refused_request_start`)
        _feed = b""  # the data being parsed ...
        _feed_at_start = False  # ... and whether it began at a request's start
        _refusal: tuple[bytes, bool] | None = None  # an answer (and its linger) waiting for those ahead
        _head_bytes = 0  # the current request's target and header lines parsed so far (bytes)
        _head_raw = 0  # bytes received since its head began, while that head was still incomplete
        _begun = 0  # requests begun in the data being parsed
        _head_too_large = False

        def data_received(self, data: bytes) -> None:
            if self._head_too_large or self._refusal is not None:
                return  # a request was refused: the rest is read and dropped until the close
            at_start = not self._receiving  # this data begins a request (unless a pipelined one follows)
            if at_start:
                self._first_bytes = bytes(data[:_REQUEST_LINE_MAX])
            self._begun = 0
            self._feed, self._feed_at_start = data, at_start
            super().data_received(data)
            self._feed = b""
            if self._receiving and not self._headers_done and not self._head_too_large:
                # the head is still incomplete: all of this data is head where the request began at its
                # start or before it (httptools holds a header's name and value until it ends, so a single
                # endless header is bounded here, not in ``on_header``)
                if self._begun == 0 or (self._begun == 1 and at_start):
                    self._head_raw += len(data)
                if self._head_raw > self.max_header_bytes:
                    self._refuse_large_head()

        def _count_head(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > self.max_header_bytes:
                self._head_too_large = True
                raise _HeadTooLarge  # httptools stops parsing; uvicorn calls ``send_400_response``

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)  # "name: value\r\n"
            super().on_header(name, value)

        def _refuse_large_head(self) -> None:
            self._head_too_large = True
            message = (
                f"the request's headers are larger than this server's limit of {self.max_header_bytes} bytes "
                "(request line and header lines)"
            )
            # Closing at once with the rest of the head unread would make the kernel send a reset, and the
            # client could lose the answer: the answer is sent, the sending side shut (the client reads
            # the answer and its end), and what still arrives is dropped until the client closes or
            # LINGER_S has passed (nginx's lingering close).
            self._answer_and_close(431, "request_header_fields_too_large", message, linger=True)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.transport = _CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
            self._arm_request_timer()  # a connection that sends nothing is closed too

        # -- errors before the app, in JSON ---------------------------------------------------------------
        def send_400_response(self, msg: str) -> None:
            self._cancel_request_timer()
            if self._head_too_large:  # raised from ``_count_head``
                self._refuse_large_head()
                return
            # uvicorn calls this inside its ``except HttpParserError``: a well-formed request line whose
            # method httptools does not know is a 501 (RFC 9110 section 15.6.2), not a malformed request
            unknown = isinstance(sys.exc_info()[1], httptools.HttpParserInvalidMethodError)
            if unknown and _REQUEST_LINE.match(self._refused_request_start()):
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

        def _refused_request_start(self) -> bytes:
            """The first bytes of the request the parser refused (b"" where they cannot be told): the data
            that began it, or, where requests pipelined ahead of it began the same data, that data after
            them. httptools does not say where in the data it stopped; the request line of the request
            ahead would make any junk behind it look like an unknown method."""
            if self._first_bytes or self._begun < 2 or not self._feed_at_start:
                return self._first_bytes
            end = _nth_request_end(self._feed, self._begun - 1)
            return b"" if end is None else bytes(self._feed[end : end + _REQUEST_LINE_MAX])

        def _earlier_answers_pending(self) -> bool:
            """Whether a request pipelined ahead of the current one (RFC 9112 section 9.3.2) is still to be
            answered: ``self.cycle`` is the last request whose head was parsed, and uvicorn answers in order."""
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return False
            if self._receiving and self._headers_done:  # the current request's own: ahead only if queued
                return any(queued is cycle for queued, _ in self.pipeline)
            return True

        def _answer_and_close(
            self, status: int, kind: str, message: str, *, linger: bool = False, retry_after_s: int = 0
        ) -> None:
            """Answer the current request ``status`` in the server's error shape and close the connection; where
            requests pipelined ahead of it are still to be answered, after their answers (uvicorn closed at
            once: the client lost those answers, and each app writing its answer to the closed connection
            logged a traceback). The current request, if queued behind them, is never run."""
            self._cancel_request_timer()
            body = ErrorBody(error=ErrorDetail(type=kind, message=message)).model_dump_json(exclude_none=True)
            head = [_STATUS_LINES[status]]
            for name, value in self.server_state.default_headers:
                head.extend([name, b": ", value, b"\r\n"])
            if retry_after_s:
                head.append(b"retry-after: %d\r\n" % retry_after_s)
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
            head.append(b"connection: close\r\n\r\n")
            answer = b"".join(head) + body.encode()
            if not self._earlier_answers_pending():
                self._receiving = False
                self._send_and_close(answer, linger=linger)
                return
            if self._receiving and self._headers_done:  # queued behind them: it never runs
                for queued in self.pipeline:
                    if queued[0] is self.cycle:
                        self.pipeline.remove(queued)
                        break
            self._receiving = False
            self._refusal = (answer, linger)  # sent by ``on_response_complete``

        def on_response_complete(self) -> None:
            """uvicorn's, then a refusal that waited for the last answer ahead of it (`_answer_and_close`)."""
            last = not self.pipeline
            super().on_response_complete()  # starts the next request in the pipeline, if any
            if last and self._refusal is not None and not self.transport.is_closing():
                answer, linger = self._refusal
                self._unset_keepalive_if_required()
                self._send_and_close(answer, linger=linger)

        def _send_and_close(self, answer: bytes, *, linger: bool) -> None:
            """Send ``answer`` and close; with ``linger``, shut the sending side and close after `LINGER_S`."""
            self.transport.write(answer)
            if linger and self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()

        # -- the stop -----------------------------------------------------------------------------------------
        def shutdown(self) -> None:
            """The server's stop begins (uvicorn calls this on every open connection): a request whose body
            is still arriving is answered 503 at once and its connection closed, and the app waiting for
            that body sees the client gone. uvicorn would wait for the body until its graceful-shutdown
            bound, then cancel the app (a plain-text 500 and a traceback); a slow client would decide how
            long every stop takes."""
            cycle = self.cycle if self._headers_done else None
            if self._receiving and cycle is not None and not cycle.response_started:
                cycle.disconnected = True
                cycle.message_event.set()
                self._answer_and_close(503, "unavailable", STOPPED_BODY_MESSAGE, retry_after_s=5)
                return
            super().shutdown()

        # -- the request timeout ----------------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._receiving, self._headers_done = True, False
            self._head_bytes = self._head_raw = 0
            self._begun += 1
            if self._begun > 1 or not self._feed_at_start:  # begun after another request in this data
                self._first_bytes = b""
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

        def eof_received(self) -> None:
            """The client has shut its sending side (or closed): a request it had begun can never arrive
            whole, and is answered 400 at once in the server's error shape before the connection closes
            (uvicorn closed without a word; the client may still be reading). The app waiting for the body
            sees the client gone. Otherwise, as uvicorn: the connection closes and an app still at work
            sees the client gone (a closed client and a half-closed one look alike here)."""
            cycle = self.cycle if self._headers_done else None
            if (
                self._receiving
                and not self._head_too_large
                and (cycle is None or not cycle.response_started)
                and not self._earlier_answers_pending()
            ):
                if cycle is not None:
                    cycle.disconnected = True
                    cycle.message_event.set()
                    message = (
                        "the request's body ended before its Content-Length (or its last chunk): the client "
                        "shut its sending side"
                    )
                else:
                    message = "the request ended before its headers did: the client shut its sending side"
                self._answer_and_close(400, "invalid_request_error", message)
            super().eof_received()  # None: the transport closes

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
        431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        501: b"HTTP/1.1 501 Not Implemented\r\n",
        503: b"HTTP/1.1 503 Service Unavailable\r\n",
    }


class _HeadTooLarge(Exception):
    """Raised in a parser callback to stop parsing a request whose head is over the bound."""


class _Ends:
    """Parser callbacks counting the requests a parser has read whole."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def on_message_complete(self) -> None:
        self.count += 1


def _nth_request_end(data: bytes, n: int) -> int | None:
    """Where the ``n``-th request in ``data`` (which begins at a request's start) ends, or None where it does
    not end in ``data``: the shortest prefix a fresh parser reads ``n`` requests from, found by bisection
    (httptools does not tell where in its data it stopped). Only on the refusal of a request pipelined
    behind others; each probe parses in C."""
    view = memoryview(data)

    def read_whole(size: int) -> int:
        ends = _Ends()
        parser = httptools.HttpRequestParser(ends)
        parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's parser
        with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
            parser.feed_data(view[:size])  # the requests read before an error count
        return ends.count

    if read_whole(len(data)) < n:
        return None
    low, high = 0, len(data)
    while low < high:
        middle = (low + high) // 2
        if read_whole(middle) >= n:
            high = middle
        else:
            low = middle + 1
    return low


def http_protocol(max_header_bytes: int = MAX_HEADER_BYTES) -> type[asyncio.Protocol] | str:
    """The ``http`` argument for ``uvicorn.run``/``uvicorn.Config``: the coalescing httptools protocol
    bounding a request's head at ``max_header_bytes`` (bytes; 431 beyond), or ``"auto"`` where uvicorn's
    httptools implementation is not available or uvicorn is outside its tested versions
    (`swarm.server.framework`; pass the same bound as ``h11_max_incomplete_event_size`` for uvicorn's h11
    protocol, which answers its plain-text 400 beyond it)."""
    if HttpToolsProtocol is None or not fast_path(PROTOCOL, "coalescing HTTP protocol"):
        return "auto"
    if max_header_bytes == SwarmHttpProtocol.max_header_bytes:
        return SwarmHttpProtocol
    return type("SwarmHttpProtocol", (SwarmHttpProtocol,), {"max_header_bytes": max_header_bytes})
