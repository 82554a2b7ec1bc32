"""`SwarmHttpProtocol` sends each response in one socket write, and the same bytes as uvicorn's own."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from swarm.server.http_protocol import SwarmHttpProtocol, http_protocol
from tests.conftest import LiveServer, free_port


async def _json(request: Request) -> Response:
    return JSONResponse({"echo": (await request.body()).decode(), "ok": True})


async def _empty(request: Request) -> Response:
    return Response(status_code=204)


async def _stream(request: Request) -> Response:
    async def chunks() -> Any:
        for i in range(3):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0.01)

    return StreamingResponse(chunks(), media_type="text/event-stream")


APP = Starlette(
    routes=[Route("/json", _json, methods=["POST"]), Route("/empty", _empty), Route("/s", _stream)]
)
REQUEST = (
    b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n"
    b"GET /s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
)


def _serve(http: Any, loop: str = "asyncio") -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(APP, port=port, loop=loop, http=http, log_level="warning", date_header=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _exchange(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(REQUEST)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write the server makes on an asyncio socket transport."""
    from asyncio import selector_events

    seen: list[bytes] = []
    original = selector_events._SelectorSocketTransport.write

    def counting(self: Any, data: Any) -> None:
        seen.append(bytes(data))
        original(self, data)

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", counting)
    return seen


def test_each_response_goes_out_in_one_write_with_the_same_bytes(writes: list[bytes]) -> None:
    for port in _serve("httptools"):
        expected = _exchange(port)
    plain = list(writes)
    writes.clear()
    for port in _serve(http_protocol()):
        got = _exchange(port)
    assert got == expected and b'{"echo":"{}","ok":true}' in got and b"data: 2" in got
    assert b"".join(writes) == b"".join(plain)
    # uvicorn writes each head apart from its body (an empty one for 204) or first chunk: 2 + 2 + (1 + 3 + 1)
    assert len(plain) == 9 and len(writes) == 6
    assert writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b'{"echo":"{}","ok":true}')
    assert writes[1].startswith(b"HTTP/1.1 204") and writes[1].endswith(b"\r\n\r\n")
    assert writes[2].startswith(b"HTTP/1.1 200") and writes[2].endswith(b"data: 0\n\n\r\n")


def test_a_head_nothing_follows_goes_out_at_the_end_of_the_turn() -> None:
    """The interim ``100 Continue`` is a head with no body after it: the client gets it without sending
    anything more, then sends its body and gets the answer."""
    for port in _serve(http_protocol()):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n"
                b"connection: close\r\n\r\n"
            )
            assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(b"{}")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"echo":"{}","ok":true}')


class _Quick(SwarmHttpProtocol):
    request_timeout_s = 0.5


def _answer(port: int, data: bytes, *, timeout_s: float = 5.0) -> tuple[bytes, float]:
    """What the server sends on one connection after ``data`` until it closes it, and how long it took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        if data:
            sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):  # a socket timeout fails the test: the server kept it open
            out += chunk
    return out, time.monotonic() - started


def _json_error(answer: bytes, status: int, kind: str) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), answer
    assert "content-type: application/json" in lines and "connection: close" in lines, lines
    error = json.loads(body)["error"]
    assert error["type"] == kind and body == json.dumps({"error": error}, separators=(",", ":")).encode()
    return str(error["message"])


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n{}",
        b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 5\r\n\r\n{}",
        b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
        b"GET /empty HTTP/1.1\r\nbad header: x\r\n\r\n",
        b"NOT-HTTP\r\n\r\n",
    ],
    ids=["non-numeric", "two-lengths", "negative", "bad-header-name", "garbage"],
)
def test_requests_refused_before_the_app_get_json_errors(request_bytes: bytes) -> None:
    for port in _serve(http_protocol()):
        answer, _ = _answer(port, request_bytes)
    assert "invalid HTTP request" in _json_error(answer, 400, "invalid_request_error")


@pytest.mark.parametrize("method", [b"FOO", b"BREW", b"X-CUSTOM"])
def test_an_unknown_method_is_501(method: bytes) -> None:
    """RFC 9110 section 15.6.2: a well-formed request whose method the server does not know is a 501 (uvicorn
    answered 400 "invalid HTTP request"); a known method a path does not serve stays the app's 405."""
    for port in _serve(http_protocol()):
        answer, _ = _answer(port, method + b" /json HTTP/1.1\r\nhost: x\r\n\r\n")
        assert "unknown HTTP method" in _json_error(answer, 501, "not_implemented")
        known, _ = _answer(port, b"PUT /json HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert known.startswith(b"HTTP/1.1 405 ")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{}", 408),  # a short body
        (b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-le", 408),  # headers that never end
        (b"", None),  # a connection that sends nothing: closed without an answer
    ],
    ids=["short-body", "partial-headers", "silent"],
)
def test_a_request_that_does_not_arrive_times_out_and_closes(
    request_bytes: bytes, status: int | None
) -> None:
    for port in _serve(_Quick):
        answer, took = _answer(port, request_bytes)
        assert 0.4 < took < 3.0
        if status is None:
            assert answer == b""
        else:
            assert "did not arrive whole within 0.5 s" in _json_error(answer, status, "request_timeout")


def test_a_body_trickled_byte_by_byte_is_cut_at_the_same_bound() -> None:
    for port in _serve(_Quick):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
            started, out = time.monotonic(), b""
            while not select.select([sock], [], [], 0.05)[0]:  # a byte every 50 ms until the server answers
                assert time.monotonic() - started < 3.0, "the server kept waiting for the body"
                sock.sendall(b"x")
            while chunk := sock.recv(65536):
                out += chunk
    assert "did not arrive whole" in _json_error(out, 408, "request_timeout")


class _SmallHeads(SwarmHttpProtocol):
    max_header_bytes = 4096


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /empty HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n",  # one huge header
        b"GET /empty HTTP/1.1\r\nhost: x\r\n" + b"x-h: aaaaaaaaaaaa\r\n" * 400 + b"\r\n",  # many headers
        b"GET /empty?" + b"q" * 5000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",  # a long target
        b"GET /empty HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 200_000,  # a header that never ends
    ],
    ids=["huge-header", "many-headers", "long-target", "unended"],
)
def test_a_head_over_the_bound_is_431_and_closed(request_bytes: bytes) -> None:
    """RFC 6585 section 5: a request whose headers are too large is answered 431, in JSON like every other
    error, and its connection closed (httptools itself takes heads of any size)."""
    for port in _serve(_SmallHeads):
        answer, took = _answer(port, request_bytes)
        assert took < 3.0
        message = _json_error(answer, 431, "request_header_fields_too_large")
        assert "limit of 4096 bytes" in message
        ok, _ = _answer(port, b"GET /empty HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 204 ")


def test_heads_within_the_bound_and_pipelined_requests_are_served() -> None:
    """A head just under the bound, and a large body followed by a pipelined request in the same data, are
    not mistaken for large heads."""
    for port in _serve(_SmallHeads):
        near = b"GET /empty HTTP/1.1\r\nhost: x\r\nx-h: " + b"a" * 3900 + b"\r\nconnection: close\r\n\r\n"
        answer, _ = _answer(port, near)
        assert answer.startswith(b"HTTP/1.1 204 "), answer[:200]
        body = b'"' + b"b" * 100_000 + b'"'
        pipelined = (
            b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
            + body
            + b"GET /empty HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        answer, _ = _answer(port, pipelined)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 204 " in answer, answer[:200]


def test_http_protocol_sets_the_bound_it_is_given() -> None:
    from swarm.config import ServerConfig
    from swarm.server.http_protocol import MAX_HEADER_BYTES

    assert ServerConfig().max_header_bytes == MAX_HEADER_BYTES == 64 * 1024
    assert http_protocol() is SwarmHttpProtocol
    small = http_protocol(2048)
    assert isinstance(small, type) and issubclass(small, SwarmHttpProtocol)
    assert small.max_header_bytes == 2048


@pytest.fixture
def server_errors() -> Iterator[list[logging.LogRecord]]:
    """The ERROR records uvicorn logs (a traceback from the app or the protocol) while a test runs."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _statuses(answer: bytes) -> list[int]:
    """The status of each response in ``answer``, in order (bodies here never hold a status line)."""
    return [int(m.group(1)) for m in re.finditer(rb"HTTP/1\.1 (\d{3}) ", answer)]


def _half_closed(port: int, data: bytes) -> bytes:
    """What the server sends after ``data`` and the client's half-close (it still reads) until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):  # a socket timeout fails the test: no answer, connection kept
            out += chunk
    return out


VALID = (
    b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n"
)
"""Two valid requests a client pipelines ahead of what the server refuses."""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_pipelined_requests_are_answered_in_order(loop: str, server_errors: list[logging.LogRecord]) -> None:
    """HTTP/1.1 pipelining (RFC 9112 section 9.3.2): every request in one write is answered, in order."""
    for port in _serve(http_protocol(), loop):
        two = b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\nGET /empty HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        answer, _ = _answer(port, two)
        assert _statuses(answer) == [204, 204], answer
        answer, _ = _answer(port, VALID + b"GET /s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert _statuses(answer) == [200, 204, 200] and b'{"echo":"{}","ok":true}' in answer
    assert not server_errors


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(
    ("refused", "status", "kind", "message"),
    [
        (b"GARBAGE\r\n\r\n", 400, "invalid_request_error", "invalid HTTP request"),
        (b"FOO /json HTTP/1.1\r\nhost: x\r\n\r\n", 501, "not_implemented", "unknown HTTP method"),
        (b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n", 400, "invalid_request_error", ""),
        (
            b"GET /empty HTTP/1.1\r\nx-big: " + b"a" * 8000 + b"\r\n\r\n",
            431,
            "request_header_fields_too_large",
            "",
        ),
    ],
    ids=["garbage", "unknown-method", "bad-length", "large-head"],
)
def test_valid_requests_pipelined_before_a_refused_one_are_answered_first(
    loop: str, refused: bytes, status: int, kind: str, message: str, server_errors: list[logging.LogRecord]
) -> None:
    """Requests ahead of one the server refuses before the app are served and answered, then the refused one
    gets the answer it gets alone (uvicorn answered only the refusal, and the app's answers to the valid
    ones hit the closed connection: a traceback per request in the log)."""
    for port in _serve(_SmallHeads, loop):
        alone, _ = _answer(port, refused)
        assert message in _json_error(alone, status, kind)
        answer, _ = _answer(port, VALID + refused)
        assert _statuses(answer) == [200, 204, status], answer[:300]
        assert b'{"echo":"{}","ok":true}' in answer
        _json_error(answer[answer.rindex(b"HTTP/1.1 ") :], status, kind)
    assert not server_errors, [r.getMessage() for r in server_errors]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_body_cut_short_by_the_clients_half_close_is_400(
    loop: str, server_errors: list[logging.LogRecord]
) -> None:
    """A body shorter than its Content-Length, then the client's end of sending (``shutdown(SHUT_WR)``): the
    body can never be whole, so the answer is a JSON 400 at once (uvicorn closed without an answer); so are
    headers cut short."""
    short = b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{}"
    for port in _serve(http_protocol(), loop):
        answer = _half_closed(port, short)
        assert "body ended before its Content-Length" in _json_error(answer, 400, "invalid_request_error")
        answer = _half_closed(port, b"POST /json HTTP/1.1\r\nhost: x\r\ncontent-le")  # headers cut short
        assert "ended before" in _json_error(answer, 400, "invalid_request_error")
    assert not [r for r in server_errors if "ClientDisconnect" not in str(r.exc_info)]


def test_the_servers_own_routes_answer_pipelined_requests_before_junk(
    server: LiveServer, server_errors: list[logging.LogRecord]
) -> None:
    """The server as ``swarm serve`` runs it (uvloop): a fresh user's pipelined ``/v1/models`` requests
    followed by junk got one 501 and a traceback per request in the log."""
    models = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    answer, _ = _answer(server.config.port, models + models + b"GARBAGE\r\n\r\n")
    assert _statuses(answer) == [200, 200, 400], answer[:300]
    assert answer.count(b'"object":"list"') == 2
    answer, _ = _answer(server.config.port, models + b"FOO / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _statuses(answer) == [200, 501], answer[:300]
    assert not server_errors, [r.getMessage() for r in server_errors]
