"""The teacher of on-policy distillation (``swarm serve --teacher URL``): an HTTP client that asks another
model server for the prompt logprobs of token ids, and the start-up check that it shares our tokenizer.

Two kinds of teacher speak to it, told apart by their ``POST /tokenize`` answer:

- **another swarm server**: ``POST /v1/score`` ``{"token_ids": [...], "start": s}`` →
  ``{"logprobs": [...]}`` (`swarm.protocol.ScoreRequest`); its ``/tokenize`` answer carries
  ``tokenizer_fingerprint`` (SHA-256 of the vocabulary), compared with ours exactly;
- **vLLM's OpenAI server** (``vllm serve``): ``POST /v1/completions`` with the ids as the prompt,
  ``max_tokens`` 1 and ``prompt_logprobs`` 0; vLLM answers ``choices[0].prompt_logprobs``, one entry per
  prompt position (``null`` for the first, else ``{"<id>": {"logprob": …, "rank": …, "decoded_token": …}}``
  holding at least the position's own token). Its ``/tokenize`` carries no fingerprint: a probe text
  (ASCII, digits, Unicode, every special token) must tokenize to the same ids as here.

Same tokenizer is required (token ids are compared one to one): a mismatch is `TeacherMismatch`, which
``swarm serve`` reports in one line and exits 2 with. A transport error, a timeout or a 5xx/429 answer is
retried (tenacity: exponential backoff with jitter, ``attempts`` tries within ``deadline_s``); any other
4xx is not (it would fail again). The credential (``SWARM_TEACHER_TOKEN`` or ``--teacher-token-file``)
goes in ``Authorization: Bearer`` and into no message, log line or event.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import SecretStr
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from swarm.errors import ConfigError, SwarmError

__all__ = [
    "ImpossibleLogprobs",
    "TeacherClient",
    "TeacherError",
    "TeacherInfo",
    "TeacherMismatch",
    "TeacherSettings",
    "check_logprobs",
    "check_teacher",
    "probe_text",
    "tokenizer_fingerprint",
]


class TeacherError(SwarmError):
    """The teacher could not score (unreachable after the retries, or it refused the request)."""

    status_code = 502
    error_type = "teacher_error"


class TeacherMismatch(ConfigError):
    """The teacher does not use this server's tokenizer (or is not a teacher at all): refused at start."""


@functools.lru_cache(maxsize=8)
def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 hex of ``tokenizer.get_vocab()`` (token → id, added and special tokens included), sorted:
    equal fingerprints mean every token maps to the same id."""
    vocab = sorted((str(k), int(v)) for k, v in tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def probe_text(tokenizer: Any) -> str:
    """Text whose token ids differ between any two tokenizers that differ in practice: words, digits,
    code, Unicode and every special token of ``tokenizer`` (chat markers included)."""
    specials = " ".join(sorted(set(tokenizer.all_special_tokens)))
    return (
        "The quick brown fox: 12345 + 67890 = 80235; def f(x): return x**2  # ünïcødé 日本語 🙂\n"
        f"{specials}\n"
    )


@dataclass(frozen=True)
class TeacherSettings:
    """How the client talks to the teacher."""

    url: str
    """Base URL (``http://host:port``; a trailing ``/v1`` is accepted and dropped)."""
    token: SecretStr | None = None
    """Bearer credential, if the teacher wants one."""
    timeout_s: float = 60.0
    """Per HTTP request."""
    attempts: int = 3
    """Tries per scoring request (transport errors, timeouts, 5xx and 429 are retried)."""
    deadline_s: float = 120.0
    """Total seconds one scoring request may take with its retries."""


@dataclass(frozen=True)
class TeacherInfo:
    """What the start-up check learned."""

    kind: Literal["swarm", "vllm"]
    model: str
    """The teacher's served model name (vLLM needs it in every request)."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):  # connection refused, reset, timeouts
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return False


class TeacherClient:
    """Asynchronous client of one teacher server; use :meth:`connect` once, then :meth:`score`.

    Args:
        settings: URL, credential, timeouts and retries.
        tokenizer: this server's tokenizer (the teacher must have the same).
        info: what an earlier :meth:`connect` (`check_teacher`) learned, if one ran.
    """

    def __init__(self, settings: TeacherSettings, tokenizer: Any, info: TeacherInfo | None = None) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.url = settings.url.rstrip("/").removesuffix("/v1")
        self.info = info
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        # Made on first use, on the loop that uses it (an AsyncClient belongs to one event loop).
        if self._http is None:
            headers = {}
            if self.settings.token is not None:
                headers["Authorization"] = f"Bearer {self.settings.token.get_secret_value()}"
            self._http = httpx.AsyncClient(
                base_url=self.url, headers=headers, timeout=self.settings.timeout_s
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self._client().post(path, json=body)
        response.raise_for_status()
        return response.json()

    # -- start-up check ----------------------------------------------------------------------------------------
    async def connect(self) -> TeacherInfo:
        """Learn the teacher's kind and model and check its tokenizer (one try, no retries).

        Raises:
            TeacherMismatch: another tokenizer, or the URL answers like no teacher (one line, no secret).
            TeacherError: unreachable, or it refused the credential.
        """
        where = f"--teacher {self.url}"
        try:
            models = (await self._client().get("/v1/models")).raise_for_status().json()
            model = str(models["data"][0]["id"])
            probe = probe_text(self.tokenizer)
            answer = await self._post(
                "/tokenize", {"model": model, "prompt": probe, "add_special_tokens": False}
            )
        except httpx.HTTPStatusError as exc:
            code = exc.response.status_code
            hint = " (set SWARM_TEACHER_TOKEN or --teacher-token-file)" if code in (401, 403) else ""
            raise TeacherError(
                f"{where}: {exc.request.method} {exc.request.url.path} answered {code}{hint}"
            ) from None
        except httpx.HTTPError as exc:
            raise TeacherError(f"{where}: unreachable ({type(exc).__name__}: {exc})") from None
        except (KeyError, IndexError, TypeError, ValueError):
            raise TeacherMismatch(f"{where}: not a swarm or vLLM server (no model in /v1/models)") from None
        if not isinstance(answer, dict) or "tokens" not in answer:
            raise TeacherMismatch(f"{where}: its /tokenize answer has no tokens (not a swarm or vLLM server)")
        fingerprint = answer.get("tokenizer_fingerprint")
        if fingerprint is not None:
            if fingerprint != tokenizer_fingerprint(self.tokenizer):
                raise TeacherMismatch(
                    f"{where}: the teacher ({model}) has another tokenizer (vocabulary fingerprint "
                    f"{str(fingerprint)[:12]}… ≠ {tokenizer_fingerprint(self.tokenizer)[:12]}…); "
                    "distillation compares token ids one to one and needs the same tokenizer"
                )
            kind: Literal["swarm", "vllm"] = "swarm"
        else:
            ours = list(self.tokenizer.encode(probe, add_special_tokens=False))
            theirs = [int(t) for t in answer["tokens"]]
            if theirs != ours:
                first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
                at = min(len(ours), len(theirs)) if first is None else first
                raise TeacherMismatch(
                    f"{where}: the teacher ({model}) has another tokenizer (a probe text gives {len(theirs)} "
                    f"ids there, {len(ours)} here, first difference at id {at}); distillation compares "
                    "token ids one to one and needs the same tokenizer"
                )
            kind = "vllm"
        self.info = TeacherInfo(kind=kind, model=model)
        return self.info

    # -- scoring -----------------------------------------------------------------------------------------------
    async def score(self, token_ids: list[int], start: int) -> tuple[list[float], float]:
        """The teacher's ``log p(token_ids[i] | token_ids[:i])`` for ``i`` in ``[start, len)`` (nats), and
        the seconds the successful request took.

        Raises:
            TeacherError: every try failed (the last reason), the teacher refused the request (4xx), or it
                answered malformed or impossible logprobs (NaN, ±inf or > 0: `check_logprobs`; not retried).
        """
        if self.info is None:
            await self.connect()
        assert self.info is not None
        retrying = AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(self.settings.attempts) | stop_after_delay(self.settings.deadline_s),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    started = time.perf_counter()
                    logprobs = await self._score_once(token_ids, start)
                    return logprobs, time.perf_counter() - started
        except httpx.HTTPStatusError as exc:
            raise TeacherError(
                f"teacher {self.url}{exc.request.url.path} answered {exc.response.status_code}"
            ) from None
        except httpx.HTTPError as exc:
            raise TeacherError(f"teacher {self.url} unreachable: {type(exc).__name__}: {exc}") from None
        except ImpossibleLogprobs as exc:
            raise TeacherError(f"teacher {self.url} answered {exc}") from None
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise TeacherError(f"teacher {self.url} answered malformed logprobs: {exc!r}") from None
        raise AssertionError("unreachable")  # pragma: no cover (tenacity returns or raises)

    async def _score_once(self, token_ids: list[int], start: int) -> list[float]:
        assert self.info is not None
        expected = len(token_ids) - start
        if self.info.kind == "swarm":
            answer = await self._post("/v1/score", {"token_ids": token_ids, "start": start})
            logprobs = [float(x) for x in answer["logprobs"]]
        else:
            body = {
                "model": self.info.model,
                "prompt": token_ids,
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "temperature": 1.0,
            }
            answer = await self._post("/v1/completions", body)
            positions = answer["choices"][0]["prompt_logprobs"]
            logprobs = [
                float(positions[i][str(token_ids[i])]["logprob"]) for i in range(start, len(token_ids))
            ]
        if len(logprobs) != expected:
            raise ValueError(f"{len(logprobs)} logprobs for {expected} positions")
        check_logprobs(logprobs, start)
        return logprobs


LOGPROB_TOLERANCE = 1e-4
"""Nats above 0 a teacher logprob may reach by float rounding (``log p`` of a token of p ≈ 1)."""


class ImpossibleLogprobs(ValueError):
    """A teacher answered a log-probability that no distribution has (not finite, or above 0)."""


def check_logprobs(logprobs: list[float], start: int = 0) -> None:
    """Refuse log-probabilities no distribution has, before anything is stored or trained on.

    Args:
        logprobs: nats, one per scored position (position ``start + i`` for item ``i``).
        start: the position of the first (only for the message).

    Raises:
        ImpossibleLogprobs: one is NaN or ±inf, or above ``LOGPROB_TOLERANCE`` (a log-probability is ≤ 0);
            the message names the first such position and value.
    """
    for i, value in enumerate(logprobs):
        if not math.isfinite(value) or value > LOGPROB_TOLERANCE:
            raise ImpossibleLogprobs(
                f"impossible logprob {value!r} at position {start + i} (log-probabilities are finite and ≤ 0)"
            )


def check_teacher(settings: TeacherSettings, tokenizer: Any) -> TeacherInfo:
    """Blocking :meth:`TeacherClient.connect` (``swarm serve`` before the app starts).

    Raises:
        TeacherMismatch, TeacherError: see :meth:`TeacherClient.connect`.
    """

    async def run() -> TeacherInfo:
        client = TeacherClient(settings, tokenizer)
        try:
            return await client.connect()
        finally:
            await client.aclose()

    return asyncio.run(run())
