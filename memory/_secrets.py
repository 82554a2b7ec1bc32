"""Secret scrubbing: nothing that looks like a credential is ever written to the store.

Scrubbing happens in the column types (`ScrubbedText`, `ScrubbedString`, `ScrubbedJSON`), so every write
path, ORM or Core, passes through it. Two rules apply:

* text: substrings shaped like well-known credentials (OpenAI/Anthropic ``sk-`` keys, ``Bearer`` tokens,
  GitHub/Hugging Face/Slack/AWS tokens, passwords inside URLs) become ``[REDACTED]``;
* mappings: the value under any key whose name says it holds a secret (``api_key``, ``token``,
  ``secret``, ``password``, ``authorization``, ``credential``...) becomes ``[REDACTED]``, recursively.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import JSON, String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

__all__ = ["REDACTED", "ScrubbedJSON", "ScrubbedString", "ScrubbedText", "scrub", "scrub_text"]

REDACTED = "[REDACTED]"

_TEXT_PATTERNS: tuple[re.Pattern[str], ...] = (
    # Anthropic (sk-ant-...), OpenAI (sk-..., sk-proj-...) and compatible provider keys.
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),
    # HTTP bearer tokens, e.g. in a logged Authorization header.
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{8,}"),
    # GitHub, Hugging Face, Slack tokens and AWS access key ids.
    re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
)
# key=value or "key": "value" pairs whose key names a secret, inside free text.
_KEY_VALUE = re.compile(
    r"(?i)(?P<key>[\w\-]*(?:api[_\-]?key|token|secret|password|passwd)[\w\-]*)"
    r"(?P<sep>\"?\s*[:=]\s*\"?)(?P<value>[^\s\"',;}&]+)"
)
# scheme://user:password@host -> scheme://user:[REDACTED]@host
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]+:)(?P<pw>[^@\s/]+)(?P<at>@)")
_SECRET_KEY = re.compile(
    r"(?i)(api[_\-]?key|token|secret|password|passwd|authorization|credential|private[_\-]?key)"
)
# Keys that merely count tokens are not secrets ("max_tokens", "token_ids", "num_tokens", "token_breaks").
_NOT_SECRET_KEY = re.compile(r"(?i)(tokens\b|tokens_|token_ids|token_count|token_breaks|tokenizer)")


def scrub_text(text: str) -> str:
    """Replace every credential-shaped substring of ``text`` with ``[REDACTED]``.

    Args:
        text: Any free text (a log message, a config value, a diff).

    Returns:
        The text with secrets replaced; unchanged when it holds none.
    """
    for pattern in _TEXT_PATTERNS:
        text = pattern.sub(REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}{m['at']}", text)
    return _KEY_VALUE.sub(
        lambda m: m[0] if _is_benign_key(m["key"]) else f"{m['key']}{m['sep']}{REDACTED}", text
    )


def _is_benign_key(key: str) -> bool:
    return _SECRET_KEY.search(key) is None or _NOT_SECRET_KEY.search(key) is not None


def scrub(value: Any) -> Any:
    """Return a copy of a JSON-like value with secrets removed.

    Mapping values under secret-named keys become ``[REDACTED]``; strings anywhere are passed through
    `scrub_text`; lists and tuples are scrubbed element by element.

    Args:
        value: ``dict``/``list``/``tuple``/``str`` or a scalar.

    Returns:
        A scrubbed copy (scalars are returned as they are).
    """
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and not _is_benign_key(key) and item is not None
            else scrub(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [scrub(item) for item in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value


class ScrubbedText(TypeDecorator[str]):
    """``TEXT`` column whose values are passed through `scrub_text` on the way in."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else scrub_text(value)


class ScrubbedString(TypeDecorator[str]):
    """``VARCHAR`` column whose values are passed through `scrub_text` on the way in."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else scrub_text(value)


class ScrubbedJSON(TypeDecorator[Any]):
    """``JSON`` column whose values are passed through `scrub` on the way in."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return scrub(value)
